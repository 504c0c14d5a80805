"""The kernels run on the CPU under the Triton interpreter here.

Triton reads TRITON_INTERPRET when ``@triton.jit`` decorates a kernel, i.e. when a ``kernels``
module is imported, so it is set before the test modules import them.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"
