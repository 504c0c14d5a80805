"""Per-round cost of the services: split (Draft + Verify over gRPC) vs co-located (Step), early draft on/off.

Each configuration starts the real stack (separate processes on this machine), runs waves
of concurrent greedy requests through the gateway and reads the gateway's own Prometheus
histograms: wall time per round, time waiting for Draft before Verify, the Verify/Step
call, and time waiting for the early draft after Verify.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from rpc.ports import free_block
from rpc.stack import Stack, StackConfig


@dataclass(frozen=True)
class ServiceCase:
    mode: str            # "colocated", "split" (the gateway runs the rounds) or "split-direct" (the verifier does)
    early_draft: bool


def _sum_count(m: dict[str, float], name: str, label: str = "") -> tuple[float, float]:
    return m.get(f"{name}_sum{label}", 0.0), m.get(f"{name}_count{label}", 0.0)


def _delta_mean_ms(before, after, name, label="") -> float:
    s0, c0 = _sum_count(before, name, label)
    s1, c1 = _sum_count(after, name, label)
    return round((s1 - s0) / (c1 - c0) * 1e3, 3) if c1 > c0 else 0.0


async def _wave(gateway, prompts: list[str], max_tokens: int) -> list:
    from rpc.gateway_client import stream
    from protos.tandem.v1 import gateway_pb2

    async def one(text):
        req = gateway_pb2.GenerateRequest()
        req.messages.messages.append(gateway_pb2.ChatMessage(role="user", content=text))
        req.sampling.max_tokens = max_tokens
        req.sampling.ignore_eos = True
        return await stream(gateway, req, timeout=1200, out=None)

    return await asyncio.gather(*(one(p) for p in prompts))


def run_case(case: ServiceCase, draft: str, k: int, batch_sizes: list[int], prompts: list[str], max_tokens: int,
             device: str | None, dtype: str | None, waves: int) -> list[dict]:
    cfg = StackConfig(port=free_block(3), metrics_port=free_block(3), colocated=case.mode == "colocated",
                      direct_draft=case.mode == "split-direct",
                      draft=draft, k=k, device=device, dtype=dtype,
                      gateway_flags={"early_draft": case.early_draft, "max_batch_size": max(batch_sizes)})
    stack = Stack(cfg)
    stack.start()
    rows = []
    try:
        stack.wait_ready()
        asyncio.run(_wave(stack.gateway, prompts[:1], 8))  # warm-up
        for bs in batch_sizes:
            before = stack.metrics("gateway")
            direct0 = _direct(stack) if case.mode == "split-direct" else None
            t0 = time.perf_counter()
            outs = []
            for w in range(waves):
                batch = [prompts[(w * bs + i) % len(prompts)] for i in range(bs)]
                outs += asyncio.run(_wave(stack.gateway, batch, max_tokens))
            elapsed = time.perf_counter() - t0
            after = stack.metrics("gateway")
            direct = _direct_ms(direct0, _direct(stack)) if direct0 is not None else {}
            rounds = after["tandem_rounds_total"] - before["tandem_rounds_total"]
            hits = after.get('tandem_early_draft_total{outcome="hit"}', 0) - before.get(
                'tandem_early_draft_total{outcome="hit"}', 0)
            misses = after.get('tandem_early_draft_total{outcome="miss"}', 0) - before.get(
                'tandem_early_draft_total{outcome="miss"}', 0)
            tokens = sum(o["output_tokens"] for o in outs)
            committed = sum(o["accepted"] + o["rounds"] for o in outs)
            rows.append({
                "mode": case.mode, "early_draft": case.early_draft if case.mode == "split" else None,
                "draft": draft, "k": k, "batch_size": bs, "requests": len(outs), "rounds": int(rounds),
                "round_ms": _delta_mean_ms(before, after, "tandem_round_seconds"),
                "draft_wait_ms": _delta_mean_ms(before, after, "tandem_round_phase_seconds", '{phase="draft"}'),
                "verify_ms": _delta_mean_ms(before, after, "tandem_round_phase_seconds", '{phase="verify"}'),
                "early_wait_ms": _delta_mean_ms(before, after, "tandem_round_phase_seconds", '{phase="wait"}'),
                "early_hit_rate": round(hits / (hits + misses), 3) if hits + misses else None,
                "acceptance_length": round(committed / sum(o["rounds"] for o in outs), 3),
                "tokens_per_s": round(tokens / elapsed, 2), **direct})
    finally:
        stack.stop()
    return rows


def _direct(stack: Stack) -> tuple[float, float, float]:
    """--direct-draft: (Draft calls the verifier sent, seconds it spent in them, seconds the drafter drafted)."""
    v, d = stack.metrics("verifier"), stack.metrics("drafter")
    return (v['tandem_verifier_draft_calls_total{outcome="sent"}'], v["tandem_verifier_draft_call_seconds"],
            d["tandem_drafter_draft_seconds"])


def _direct_ms(before: tuple[float, float, float], after: tuple[float, float, float]) -> dict[str, float]:
    """Per Draft call: its wall time at the verifier and the drafter's own work in it, ms."""
    calls = after[0] - before[0]
    if not calls:
        return {"draft_calls": 0}
    return {"draft_calls": int(calls), "draft_call_ms": round((after[1] - before[1]) / calls * 1e3, 3),
            "drafter_work_ms": round((after[2] - before[2]) / calls * 1e3, 3)}


def markdown(rows: list[dict]) -> str:
    cols = ["mode", "early_draft", "batch_size", "round_ms", "draft_wait_ms", "verify_ms", "early_wait_ms",
            "early_hit_rate", "draft_calls", "draft_call_ms", "drafter_work_ms", "acceptance_length", "tokens_per_s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
