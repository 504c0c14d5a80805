"""serving.Outcome across the engine process's pipe: its columns as one buffer, every field as it was."""

from __future__ import annotations

import pickle

import numpy as np

from engine.request import FinishReason, RequestOutput
from rpc import tensors
from verifier_svc.serving import _columns
from verifier_svc.servicer import round_report


def out(rid: str, tokens: list[int], text: str, finish: FinishReason | None, accepted: int,
        rounds: int = 1) -> RequestOutput:
    return RequestOutput(rid, tokens, text, finish is not None, finish, 3, len(tokens), 1, 0, 0,
                         round_accepted=accepted, round_drafted=4, round_count=rounds)


def test_an_outcome_crosses_pickle_with_every_column_and_field_intact():
    rows = [(4, out("s:4", [11, 12, 13], "héllo", None, 2, rounds=2), 4), (9, out("s:9", [], "", None, 0), 0),
            (2, out("s:2", [7], "!", FinishReason.STOP, 0), 3)]
    o = _columns(rows, start=123, duration=456)
    back = pickle.loads(pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL))
    assert back.rounds.tolist() == [2, 1, 1]  # a replay of two rounds (--spec-rounds) says so
    report = round_report(back)  # and the wire's report carries it
    assert tensors.to_numpy(report.rounds, "rounds").tolist() == [2, 1, 1]
    for name in ("slots", "counts", "tokens", "accepted", "drafted", "k", "text_offsets", "rounds"):
        got, want = getattr(back, name), getattr(o, name)
        assert got.dtype == np.int32 and got.tolist() == want.tolist(), name
    assert back.tokens.tolist() == [11, 12, 13, 7] and back.slots.tolist() == [4, 9, 2]
    assert back.finish == (None, None, FinishReason.STOP)
    assert back.text == "héllo!".encode() and back.text_offsets.tolist() == [0, 6, 6, 7]
    assert (back.start_unix_nano, back.duration_ns) == (123, 456)


def test_an_outcome_of_no_rows_crosses_pickle():
    back = pickle.loads(pickle.dumps(_columns([], 1, 2)))
    assert back.slots.size == back.tokens.size == 0 and back.text_offsets.tolist() == [0] and back.finish == ()
