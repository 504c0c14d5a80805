"""A client of the gateway's ``Generate``: one streamed answer and its summary (``tandem client``, the demo,
``bench.services``)."""

from __future__ import annotations

import sys
import time


async def stream(address: str, request, timeout: float, out=sys.stdout) -> dict:
    """Call Generate and stream the text to ``out``; returns the summary dict."""
    import grpc

    from protos.tandem.v1 import gateway_pb2_grpc
    from rpc import convert, tensors

    start = time.perf_counter()
    first = None
    ids: list[int] = []
    text = ""
    last = None
    async with grpc.aio.insecure_channel(address) as ch:
        async for resp in gateway_pb2_grpc.GatewayStub(ch).Generate(request, timeout=timeout):
            new = tensors.token_ids(resp.token_ids, "token_ids")
            if new and first is None:
                first = time.perf_counter() - start
            ids += new
            text += resp.text
            if out is not None:
                out.write(resp.text)
                out.flush()
            last = resp
    elapsed = time.perf_counter() - start
    u = last.usage
    return {"text": text, "token_ids": ids,
            "finish_reason": (convert.finish_from_pb(last.finish_reason).value
                              if convert.finish_from_pb(last.finish_reason) else None),
            "prompt_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens, "rounds": u.rounds,
            "accepted": u.accepted_tokens, "drafted": u.draft_tokens,
            "acceptance_length": round(u.acceptance_length, 4),
            "tokens_per_s": round(len(ids) / elapsed, 2) if elapsed > 0 else 0.0,
            "time_to_first_token_s": round(first or 0.0, 4), "elapsed_s": round(elapsed, 4),
            "request_id": last.request_id, "address": address}
