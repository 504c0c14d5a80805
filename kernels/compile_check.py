"""Compile the layer kernels for a GPU architecture without a GPU: ``python -m kernels.compile_check [SM]``.

Front-end, lowering and ptxas errors show up here, on any machine with triton installed (its
bundled ptxas), instead of on the GPU machine. Prints one line per kernel and specialization
(shared memory it needs); exits 1 on the first failure. Run it without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import os
import sys


def _cases():
    from kernels import (argmax_rows, fused_norm, greedy_accept, l2_prefetch, next_inputs, philox, rejection_accept,
                         rmsnorm, rotary, silu_mul, static_attention, topk_rows, tree_sample_accept)
    from kernels._common import pow2_at_least

    for load in (False, True):
        yield (f"l2_prefetch load={load}", l2_prefetch._l2_prefetch_kernel,
               dict(p0="*u8", p1="*u8", p2="*u8", p3="*u8", n0="i32", n1="i32", n2="i32", n3="i32", sink_ptr="*i32"),
               dict(LINES=l2_prefetch.LINES, UNIT=l2_prefetch.SECTOR if load else l2_prefetch.LINE, LOAD=load))

    yield ("greedy_accept", greedy_accept._greedy_accept_kernel,
           dict(draft_ptr="*i64", num_draft_ptr="*i64", target_ptr="*i64", out_ptr="*i64", num_accepted_ptr="*i64",
                K="i32", stride_d="i32", stride_n="i32"), dict(PLACEHOLDER=-1, BLOCK=8))

    for has_q in (False, True):
        yield (f"rejection_accept has_q={has_q}", rejection_accept._rejection_accept_kernel,
               dict(draft_ptr="*i64", num_draft_ptr="*i64", p_ptr="*fp32", q_ptr="*fp32", u_ptr="*fp32",
                    noise_ptr="*fp32", val_ptr="*fp32", idx_ptr="*i64", ticket_ptr="*i32", out_ptr="*i64",
                    num_accepted_ptr="*i64", K="i32", V="i32", chunks="i32",
                    **{n: "i32" for n in ("stride_d", "stride_n", "stride_pb", "stride_pk", "stride_qb", "stride_qk",
                                          "stride_u", "stride_e")}),
               dict(HAS_Q=has_q, PLACEHOLDER=-1, BLOCK_K=8, BLOCK=rejection_accept.BLOCK, NB=32))

    for shape, nodes in (((3, 1), 6), ((2, 2, 1, 1), 14)):  # draft trees and their nodes
        yield (f"tree_sample_accept tree={shape}", tree_sample_accept._tree_sample_kernel,
               dict(nodes_ptr="*i64", num_draft_ptr="*i64", p_ptr="*fp32", u_ptr="*fp32", noise_ptr="*fp32",
                    child_ptr="*i64", branch_ptr="*i64", first_ptr="*i64", val_ptr="*fp32", idx_ptr="*i64",
                    ticket_ptr="*i32", committed_ptr="*i64", accepted_ptr="*i64", path_ptr="*i64", N="i32", V="i32",
                    chunks="i32", **{n: "i32" for n in ("stride_t", "stride_n", "stride_pb", "stride_pk", "stride_u",
                                                        "stride_e")}),
               dict(D=len(shape), BMAX=max(shape), PLACEHOLDER=-1, BLOCK_N=pow2_at_least(nodes + 1),
                    BLOCK_D=pow2_at_least(len(shape) + 1), BLOCK_B=pow2_at_least(max(shape)),
                    BLOCK=tree_sample_accept.BLOCK, NB=32))

    yield ("next_inputs", next_inputs._next_inputs_kernel,
           dict(inputs_ptr="*i64", kv_ptr="*i64", committed_ptr="*i64", num_accepted_ptr="*i64", drafts_ptr="*i64",
                K="i32", W="i32", stride_i="i32", stride_c="i32", stride_d="i32"), dict(BLOCK=8))

    for noise in (False, True):
        yield (f"argmax_rows noise={noise}", argmax_rows._argmax_rows_kernel,
               dict(x_ptr="*fp32", noise_ptr="*fp32", val_ptr="*fp32", idx_ptr="*i64", ticket_ptr="*i32",
                    out_ptr="*i64", V="i32", stride_x="i32", stride_n="i32", chunks="i32"),
               dict(HAS_NOISE=noise, BLOCK=argmax_rows.BLOCK, NB=32))

    for b in (1, 2, 4):
        yield (f"topk_rows b={b}", topk_rows._topk_rows_kernel,
               dict(x_ptr="*bf16", val_ptr="*fp32", idx_ptr="*i64", ticket_ptr="*i32", out_ptr="*i64", V="i32",
                    stride_x="i32", chunks="i32"), dict(B=b, BLOCK=topk_rows.BLOCK, NB=32 * b))

    for exponential in (False, True):
        yield (f"philox exponential={exponential}", philox._philox_kernel,
               dict(out_ptr="*fp32", seeds_ptr="*i64", counters_ptr="*i64", out_stride="i32", N="i32", col0="i32",
                    stream="i32"), dict(EXPONENTIAL=exponential, ROUNDS=philox.ROUNDS, BLOCK=philox.BLOCK))

    for dt in ("bf16", "fp16", "fp32"):
        sig = {n: f"*{dt}" for n in ("q_ptr", "k_ptr", "v_ptr", "kc_ptr", "vc_ptr", "out_ptr")}
        sig.update(cos_ptr="*fp32", sin_ptr="*fp32", table_ptr="*i64", lens_ptr="*i64", max_blocks="i32",
                   sm_scale="fp32", **{n: "i32" for n in ("stride_qt", "stride_qh", "stride_kt", "stride_kh",
                                                           "stride_vt", "stride_vh", "stride_rope")})
        sig.update(part_ptr="*fp32")
        for q, splits in ((1, 1), (1, 8), (5, 1), (5, 8), (9, 2)):
            block_m = max(16, 1 << (3 * q - 1).bit_length())
            const = dict(Q=q, G=3, HKV=3, HALF=32, BS=16, BLOCK_Q=16, BLOCK_M=block_m, BLOCK_N=static_attention.BLOCK_N,
                         SPLITS=splits, IEEE=dt == "fp32", PIPELINED=True)
            yield f"static_attention {dt} q_len={q} splits={splits}", static_attention._static_attention_kernel, sig, const
            if splits > 1:
                yield (f"static_attention combine {dt} q_len={q} splits={splits}", static_attention._combine_kernel,
                       dict(part_ptr="*fp32", out_ptr=f"*{dt}"),
                       dict(Q=q, G=3, HKV=3, D=64, BLOCK_M=block_m, SPLITS=splits, BLOCK_S=1 << (splits - 1).bit_length()))
        yield (f"add_rmsnorm {dt}", fused_norm._add_rmsnorm_kernel,
               dict(x_ptr=f"*{dt}", d_ptr=f"*{dt}", w_ptr=f"*{dt}", res_ptr=f"*{dt}", out_ptr=f"*{dt}",
                    stride_x="i32", stride_d="i32", D="i32", eps="fp32"), dict(BLOCK=1024))
        yield (f"rmsnorm {dt}", rmsnorm._rmsnorm_kernel,
               dict(x_ptr=f"*{dt}", w_ptr=f"*{dt}", out_ptr=f"*{dt}", stride_x="i32", D="i32", eps="fp32"),
               dict(BLOCK=1024))
        yield (f"rmsnorm_pair {dt}", rmsnorm._rmsnorm_pair_kernel,
               dict(a_ptr=f"*{dt}", wa_ptr=f"*{dt}", b_ptr=f"*{dt}", wb_ptr=f"*{dt}", out_ptr=f"*{dt}",
                    stride_a="i32", stride_b="i32", D="i32", eps="fp32"), dict(BLOCK=1024))
        yield (f"silu_mul {dt}", silu_mul._silu_mul_kernel,
               dict(x_ptr=f"*{dt}", out_ptr=f"*{dt}", stride_x="i32", I="i32"), dict(BLOCK=silu_mul.BLOCK))
        yield (f"rotary {dt}", rotary._rotary_kernel,
               dict(x_ptr=f"*{dt}", pos_ptr="*i64", cs_ptr="*fp32", out_ptr=f"*{dt}", stride_t="i32",
                    stride_h="i32", H="i32", HALF="i32"), dict(BLOCK=32))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check: unset TRITON_INTERPRET (interpreted kernels do not compile)", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", int(argv[0]) if argv else 90, 32)
    for name, kernel, signature, constexprs in _cases():
        signature = {**signature, **{k: "constexpr" for k in constexprs}}
        try:
            compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=target)
        except Exception as exc:  # noqa: BLE001 - report which kernel, then fail
            print(f"compile_check: {name} for sm_{target.arch} failed: {exc}", file=sys.stderr)
            return 1
        print(f"{name}: sm_{target.arch} ok, {compiled.metadata.shared} B shared memory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
