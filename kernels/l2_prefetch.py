"""Pull tensors' bytes into the GPU's L2 ahead of their use, on a stream beside the one that reads them.

At decode sizes a projection reads its weights once per forward and waits on DRAM for them; a model's layers
do not fit in L2 together, but the next layer's do. ``l2_prefetch(tensors, programs)``: for each of up to
``MAX_TENSORS`` tensors, ``programs`` programs walk its bytes and either
- ``mode="prefetch"``: issue ``prefetch.global.L2::evict_last`` per 128-byte line (a hint: nothing waits for
  the line, nothing is stored), or
- ``mode="load"``: load a byte of every 32-byte sector (L2 fills sectors, not whole lines, on a load;
  ``evict_last``, so they outlive streaming traffic) and fold them into a value that is stored only if it is
  impossible (so the loads are kept): the launch ends when the sectors are in.
Nothing here changes a value anywhere; a wrong prefetch only costs bandwidth. CUDA only (inline PTX): no
interpreter path and no torch reference, since there is no result to compare.
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from kernels._common import check_int, check_launchable

LINE, SECTOR = 128, 32  # bytes per L2 line, per sector
LINES = 256  # addresses a program takes per step (two per thread of 4 warps)
MAX_TENSORS = 4  # a decoder layer's projections: q/k/v, o, gate/up, down
MODES = ("prefetch", "load")


@triton.jit
def _walk(ptr, n_units, sink_ptr, LINES: tl.constexpr, UNIT: tl.constexpr, LOAD: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([LINES], tl.int32)
    for start in range(pid * LINES, n_units, tl.num_programs(0) * LINES):
        units = tl.minimum(start + tl.arange(0, LINES), n_units - 1).to(tl.int64)
        addr = ptr + units * UNIT
        if LOAD:
            acc += tl.load(addr, eviction_policy="evict_last").to(tl.int32)
        else:
            acc += tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [addr],
                                             dtype=tl.int32, is_pure=False, pack=1)
    total = tl.sum(acc, axis=0)
    tl.store(sink_ptr + pid, total, mask=total == -1)  # never true (bytes and zeros sum >= 0): keeps the loads


@triton.jit
def _l2_prefetch_kernel(p0, p1, p2, p3, n0, n1, n2, n3, sink_ptr,
                        LINES: tl.constexpr, UNIT: tl.constexpr, LOAD: tl.constexpr):
    # program (i, t): the i-th share of tensor t's bytes (p_t, n_t units of UNIT bytes)
    t = tl.program_id(1)
    if t == 0:
        _walk(p0, n0, sink_ptr, LINES, UNIT, LOAD)
    elif t == 1:
        _walk(p1, n1, sink_ptr, LINES, UNIT, LOAD)
    elif t == 2:
        _walk(p2, n2, sink_ptr, LINES, UNIT, LOAD)
    else:
        _walk(p3, n3, sink_ptr, LINES, UNIT, LOAD)


def l2_prefetch(tensors: torch.Tensor | Sequence[torch.Tensor], programs: int = 8, mode: str = "prefetch") -> None:
    """Queue a prefetch of the tensors' bytes (1 to ``MAX_TENSORS`` contiguous CUDA tensors on one device) into L2
    on the current stream: one launch of ``programs`` programs per tensor."""
    ts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    if not 1 <= len(ts) <= MAX_TENSORS:
        raise ValueError(f"tensors must hold 1 to {MAX_TENSORS} tensors, got {len(ts)}")
    for i, t in enumerate(ts):
        if not isinstance(t, torch.Tensor) or not t.is_cuda or not t.is_contiguous() or t.device != ts[0].device:
            raise ValueError(f"tensors[{i}] must be a contiguous CUDA tensor on {getattr(ts[0], 'device', None)}, "
                             f"got {getattr(t, 'device', type(t).__name__)}")
    check_int("programs", programs, 1)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    check_launchable(_l2_prefetch_kernel, ts[0].device)
    unit = SECTOR if mode == "load" else LINE
    raw = [t.view(-1).view(torch.uint8) for t in ts if t.numel()]
    if not raw:
        return
    sizes = [triton.cdiv(r.numel(), unit) for r in raw]
    ptrs = raw + [raw[0]] * (MAX_TENSORS - len(raw))
    sizes += [0] * (MAX_TENSORS - len(raw))
    sink = torch.empty(programs, dtype=torch.int32, device=raw[0].device)
    _l2_prefetch_kernel[(programs, len(raw))](*ptrs, *sizes, sink, LINES=LINES, UNIT=unit, LOAD=mode == "load")
