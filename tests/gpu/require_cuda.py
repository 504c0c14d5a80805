"""``make test-gpu``'s first step: stop with what to do when this environment cannot run the GPU tests (a CPU build
of torch, or no GPU it can see), instead of letting every test skip and the run pass."""

from __future__ import annotations

import sys

HOW = ("install a CUDA build of torch (README.md, \"On a GPU\"), e.g. on a fresh clone: make test-gpu "
       "TORCH_SPEC=torch==2.11.0 TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130 (NVIDIA driver >= 580)")


def main() -> int:
    import torch

    if torch.cuda.is_available():
        print(f"make test-gpu: {torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda})")
        return 0
    if torch.version.cuda is None:
        why = f"torch {torch.__version__} is a CPU build"
    else:
        why = (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: no NVIDIA GPU or driver here, or "
               f"a driver older than this CUDA build needs")
    print(f"make test-gpu: the GPU tests need CUDA, and {why}; {HOW}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
