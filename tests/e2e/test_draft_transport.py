"""The verifier's two ways to ask its drafter service for a round's drafts (verifier_svc/remote_drafter.py): the
``DraftStream`` kept open across rounds (what the verifier uses) and one unary ``Draft`` a round (what
bench/wire_probe.py times beside it). A real drafter service on loopback; both see the same drafts."""

from __future__ import annotations

import subprocess
import sys

from engine.config import SamplingParams
from engine.drafters.base import DraftRequest
from engine.drafters.ngram import NgramDrafter
from rpc.ports import free_block
from verifier_svc.remote_drafter import RemoteDrafter, open_channel


def test_the_stream_and_unary_calls_draft_what_the_drafter_drafts():
    port = free_block(1)
    drafter = subprocess.Popen([sys.executable, "-m", "cli.main", "drafter", "--draft", "ngram", "--device", "cpu",
                                "--insecure", "--drafter-port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        address = f"127.0.0.1:{port}"
        stream, unary = (RemoteDrafter(address, 49152, channel=open_channel(address, 64 << 20, None), timeout_s=30.0,
                                       connect_timeout_s=120.0, stream=s) for s in (True, False))
        params = SamplingParams(max_tokens=64)
        tokens = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
        local = NgramDrafter()
        for step in range(3):  # the second and later calls send only the tokens the drafter has not seen
            tokens += [7 + step, 8]
            want = local.propose([DraftRequest("r", list(tokens), 4, params)]).token_ids
            for remote in (stream, unary):
                got = remote.propose([DraftRequest("r", list(tokens), 4, params)])
                assert got.token_ids == want and got.probs is None, (remote.stream, step)
                assert remote.sent == {"r": len(tokens)}
        assert stream.stats() == unary.stats() == {"sent": 3, "failed": 0, "resynced": 0}
        assert stream._stream is not None and unary._stream is None  # the unary one never opened a stream
    finally:
        drafter.kill()
