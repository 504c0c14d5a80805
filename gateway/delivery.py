"""Where a request's outcome reaches its client: its committed tokens and text into its stream, the latency
metrics (time to first token, inter-token latency), and its end (finish metrics, its trace span). Both round
drivers deliver through it: the gateway's own (split mode, scheduler.py) and the verifier's (co-located Serve
streams, streamed.py)."""

from __future__ import annotations

import grpc

from engine.request import FinishReason
from gateway.metrics import GatewayMetrics
from gateway.requests import Event, GatewayRequest


class Delivery:
    def __init__(self, metrics: GatewayMetrics) -> None:
        self.m = metrics

    def commit(self, r: GatewayRequest, committed: list[int], text: str, finish: FinishReason | None,
               accepted: int, drafted: int, now: float) -> None:
        """One round's outcome for ``r``: its stream gets the tokens (and the end, when ``finish``)."""
        r.rounds += 1
        r.accepted += accepted
        r.drafted += drafted
        r.output_ids += committed
        if committed:
            if r.first_token_at is None:
                r.first_token_at = now
                self.m.ttft.observe(now - r.arrival)
            elif r.last_token_at is not None:
                gap = (now - r.last_token_at) / len(committed)
                for _ in committed:
                    self.m.itl.observe(gap)
            r.last_token_at = now
            self.m.streamed(len(committed), now)
        r.finish_reason = finish
        r.events.put_nowait(Event(committed, text, finish))

    def fail(self, r: GatewayRequest, code: grpc.StatusCode, message: str) -> None:
        """``r`` ends with this error on its stream."""
        r.finish_reason = FinishReason.ABORT
        r.events.put_nowait(Event(error=(code, message)))

    def end(self, r: GatewayRequest) -> None:
        """``r`` is over (finished, failed or cancelled): its finish counted, its span ended."""
        self.m.requests.labels(r.finish_reason.value if r.finish_reason else "error").inc()
        if r.span is not None:
            r.span.set_attributes({"tandem.completion_tokens": len(r.output_ids), "tandem.rounds": r.rounds,
                                   "tandem.accepted_tokens": r.accepted,
                                   "tandem.finish_reason": r.finish_reason.value if r.finish_reason else "error"})
            r.span.end()
