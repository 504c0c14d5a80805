"""serving.Lifetimes: where a Serve request's time goes inside the engine, as running sums."""

from __future__ import annotations

import pytest

from engine.request import FinishReason, RequestOutput
from verifier_svc.serving import Lifetimes


def out(rid: str, tokens: list[int], finished: bool = False) -> RequestOutput:
    return RequestOutput(rid, tokens, "", finished, FinishReason.LENGTH if finished else None, 3, len(tokens), 1, 0, 0)


def test_queued_first_and_life_sum_over_finished_requests_and_dropped_ones_leave_no_trace():
    lives = Lifetimes()
    lives.admitted("a", queued=1.0, now=1.5)
    lives.admitted("b", queued=1.0, now=2.0)
    lives.admitted("c", queued=2.0, now=2.25)
    lives.handed_out([out("a", []), out("b", [7])], now=3.0)  # a: its prefill round gave no token yet
    lives.drop("c")  # cancelled: never finishes, never counted past its queueing
    lives.handed_out([out("a", [5]), out("b", [8], finished=True), out("c", [1], finished=True),
                      out("other", [9], finished=True)], now=4.0)  # "other": not a Serve request
    lives.handed_out([out("a", [6], finished=True)], now=5.0)
    assert lives.sums == pytest.approx({"requests": 2, "queued": 0.5 + 1.0 + 0.25, "first": (4.0 - 1.5) + (3.0 - 2.0),
                                        "life": (5.0 - 1.5) + (4.0 - 2.0)})
