"""The configuration Tandem ships on a GPU, built the way `tandem generate` and `tandem verifier` build it.

Every engine knob comes from ``rpc.settings.EngineSettings`` (the one settings path of the CLI and the
services): fused rounds, rounds launched ahead, the batch policy (``spec_max_batch`` 16), CUDA graphs,
the shipped drafter (``auto``: the EAGLE head), k 4; and the two switches users reach for,
``--enforce-eager`` and ``--no-fused-rounds``. Each must decode exactly what plain greedy decoding
does. The numerics are pinned to float32 with the torch attention for prompts, where exact equality
holds (in bfloat16 a verify and a decode step round differently: tests/gpu/test_gpu_engine.py).
"""

from __future__ import annotations

import pytest
import torch

from engine.config import SamplingParams
from engine.drafters import DraftSpec, build_drafter
from engine.factory import decoder_for
from engine.spec import SpecDecoder
from rpc.settings import EngineSettings
from verifier_svc.settings import VerifierSettings

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

NUMERICS = {"device": "cuda", "dtype": "float32", "attention": "torch", "kv_cache_tokens": 16384}
VARIANTS = {"shipped": {}, "enforce_eager": {"enforce_eager": True}, "no_fused_rounds": {"fused_rounds": False}}
TEXTS = ["Write a Python function that checks whether a number is prime.", "Name three rivers in Europe.",
         "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
         "Explain recursion to a child in two sentences.", "List the days of the week.", "What is 12 times 12?",
         "Name a color.", "Count from one to ten.", "Why is the sky blue?", "Write a haiku about rain.",
         "Translate 'good morning' into Spanish.", "What does a compiler do?", "Name two planets.",
         "Give a synonym for happy.", "Sort these numbers: 5, 2, 9, 1.", "What is the boiling point of water?",
         "Write a limerick about a cat.", "Describe a triangle."]


def _decoder(model, settings: EngineSettings) -> SpecDecoder:
    config = settings.engine_config()
    return decoder_for(model, config, settings.draft)


def _greedy(dec: SpecDecoder, prompts, max_tokens: list[int]) -> list[list[int]]:
    outs = dec.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    return [o.new_token_ids for o in outs]


@pytest.fixture(scope="module")
def reference(f32):
    """Plain greedy decoding, eagerly: the target alone."""
    prompts = [f32.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TEXTS]
    plain = _decoder(f32, EngineSettings(**NUMERICS, draft="none", k=0, enforce_eager=True))
    lengths = [40 + 7 * i for i in range(len(prompts))]  # the batch shrinks as requests finish
    return prompts, lengths, {n: _greedy(plain, prompts[:n], lengths[:n]) for n in (1, 8, 16, 18)}


def test_the_services_ship_what_the_cli_ships():
    assert VerifierSettings(**NUMERICS, draft="auto").engine_config() == \
        EngineSettings(**NUMERICS).engine_config()


@pytest.mark.parametrize("variant", VARIANTS)
def test_shipped_configuration_decodes_plain_greedy(f32, reference, variant):
    prompts, lengths, plain = reference
    settings = EngineSettings(**NUMERICS, **VARIANTS[variant])
    assert settings.draft == "auto" and settings.k == 4 and settings.spec_max_batch == 16
    dec = _decoder(f32, settings)
    if variant == "shipped":  # the fast path is really on: rounds in graphs, the next one launched ahead
        assert dec.fused is not None and dec.fused.capture and dec.config.pipeline_rows == 64
    # 1 request: speculative rounds (launched ahead where shipped); 16: the policy's limit (two rounds a replay);
    # 18: every request decodes plainly (more than spec_max_batch run), on the plain graph where fused rounds are on
    for n in (1, 16, 18):
        assert _greedy(dec, prompts[:n], lengths[:n]) == plain[n], (variant, n)
    if variant == "shipped":
        assert dec.fused.rounds > 0 and dec.fused.rounds_ahead > 0
        assert dec.fused_plain is not None and dec.fused_plain.rounds > 0
        assert sum(dec.fast_path_exits.values()) == 0, dec.fast_path_exits


def test_a_drafter_outside_the_graph_is_guarded_by_timed_costs(f32, reference):
    """The shipped settings with a drafter that drafts on the host, outside the round's graph (as a drafter
    service's does in split mode): the plain graph's replays are timed at capture, the speculative rounds as they run,
    and the guard (engine/policy.py SpecGuard) decides from both; whichever it decides, output is plain greedy."""
    from engine.drafters.ngram import NgramDrafter
    from engine.policy import GUARD_ROUNDS, MARGIN

    prompts, lengths, plain = reference
    config = EngineSettings(**NUMERICS).engine_config()
    dec = decoder_for(f32, config, NgramDrafter())
    assert dec.fused is None and dec.fast.guard is not None
    dec.capture_rounds()
    guard = dec.fast.guard
    assert guard.plain_ms and all(ms > 0 for ms in guard.plain_ms.values())
    for n in (1, 8):
        assert _greedy(dec, prompts[:n], lengths[:n]) == plain[n], n
    spent, tokens, rounds = guard.spec[1]
    assert rounds >= GUARD_ROUNDS and tokens / rounds >= 1.0
    pays = tokens / rounds * guard.plain_ms[1] >= MARGIN * spent / rounds
    assert guard.speculate(1, clean=False) is pays  # its verdict is its figures' (clean=False: none expire now)


def test_requests_whose_outside_drafter_does_not_pay_draft_with_the_local_one_in_its_graphs(f32, reference):
    """The split verifier's default: a drafter outside the graph beside the verifier's own n-gram drafter, whose
    speculative graph is captured; where a plain token costs next to nothing the outside drafter's rounds never pay,
    so the requests draft in the local drafter's graph (not plainly); output is plain greedy."""
    from engine.drafters.ngram import NgramDrafter

    prompts, lengths, plain = reference
    config = EngineSettings(**NUMERICS).engine_config()
    local = build_drafter(DraftSpec.parse("ngram"), f32, config)
    outside = NgramDrafter()
    outside.batch_weight = 2  # what a drafter service weighs (verifier_svc/remote_drafter.py): 8 requests speculate
    dec = decoder_for(f32, config, outside, local=local)
    assert dec.fast.local is local and dec.fused.k and dec.fast.guard is not None
    dec.capture_rounds()
    guard = dec.fast.guard
    guard.plain_ms.update({b: 1e-6 for b in guard.plain_ms})
    for n in (1, 8):
        assert _greedy(dec, prompts[:n], lengths[:n]) == plain[n], n
    assert dec.scheduler.rows["on_graph"] > 0 and dec.scheduler.rows["demoted"] == 0, dec.scheduler.rows
    assert guard.speculate(1, clean=False) is False
