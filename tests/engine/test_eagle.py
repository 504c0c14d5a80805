"""The EAGLE head drafter: the shipped default for SmolLM2, incremental catch-up, starting from a window."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.config import EngineConfig, SamplingParams
from engine.drafters import TRAINED_DIR, DraftRequest, DraftSpec, resolve_draft, trained_drafter_for
from engine.drafters.eagle import EagleDrafter
from engine.models.eagle import load_eagle
from engine.runner import Chunk, ModelRunner
from tests.conftest import make_decoder

GREEDY = SamplingParams(max_tokens=48, ignore_eos=True, seed=0)
PROMPTS = ["Tell me about the moon.", "Write a short story about a robot.", "How do airplanes fly?",
           "What makes a good friend?"]


@pytest.fixture(scope="module")
def prompts(smollm):
    return [smollm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in PROMPTS]


@pytest.fixture(scope="module")
def plain(smollm, prompts):
    return make_decoder(smollm, "none").generate(prompts, GREEDY)


def test_auto_is_the_shipped_head_for_smollm2_and_ngram_otherwise(smollm):
    spec = resolve_draft(DraftSpec.parse("auto"), smollm.config, quiet=True)
    assert spec.kind == "eagle" and spec.path.parent == TRAINED_DIR
    assert (spec.path / "model.safetensors").stat().st_size <= 20 * 2**20  # ships in the repository
    other = dataclasses.replace(smollm.config, num_layers=12)
    assert trained_drafter_for(other) is None
    assert resolve_draft(DraftSpec("auto"), other, quiet=True) == DraftSpec("ngram")
    assert str(DraftSpec.parse("auto")) == "auto"


def test_default_drafter_is_lossless_and_drafts_well(smollm, prompts, plain):
    dec = make_decoder(smollm, "auto", k=4)
    assert dec.drafter.name.startswith("eagle:")
    outs = dec.generate(prompts, GREEDY)
    for o, p in zip(outs, plain):
        assert o.new_token_ids == p.new_token_ids
    accepted, rounds = sum(o.accepted for o in outs), sum(o.rounds for o in outs)
    # a trained head: well above the ~1.0 tokens per round of an untrained one (measured ~2.2 at k=4)
    assert (accepted + rounds) / rounds > 1.5


def test_sampled_output_with_the_head_is_seeded_and_reproducible(smollm, prompts):
    params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=7)
    a = make_decoder(smollm, "auto", k=4).generate(prompts[:2], params)
    b = make_decoder(smollm, "auto", k=4).generate(prompts[:2], params)
    assert [o.new_token_ids for o in a] == [o.new_token_ids for o in b]


@pytest.fixture(scope="module")
def head(smollm):
    return load_eagle(trained_drafter_for(smollm.config), smollm.model, "cpu", torch.float32)


def _features(smollm, head, tokens):
    """The target's aux features of every position of ``tokens``, from one full forward."""
    cfg = EngineConfig(kv_cache_tokens=4096)
    return ModelRunner(smollm.model, cfg).run([Chunk("f", tokens)], aux_layers=head.eagle.aux_layers).aux


def test_incremental_catch_up_drafts_like_a_fresh_drafter(smollm, head, prompts, plain):
    """Rounds that commit 1..4 tokens, features handed over once each: the drafter rolls its chain back and
    catches up; at every state it drafts what a drafter built from scratch on the same context drafts."""
    cfg = EngineConfig(kv_cache_tokens=4096, k=3)
    tokens = prompts[0] + plain[0].new_token_ids
    aux = _features(smollm, head, tokens)
    inc = EagleDrafter("inc", head, cfg)
    n, fed, steps, same = len(prompts[0]), 0, 0, 0
    for step in range(12):
        got = inc.propose([DraftRequest("r", tokens[: n + 1], 3, GREEDY, aux[fed:n], fed)]).token_ids[0]
        fresh = EagleDrafter("fresh", head, cfg).propose(
            [DraftRequest(f"f{step}", tokens[: n + 1], 3, GREEDY, aux[:n], 0)]).token_ids[0]
        steps, same = steps + 1, same + (got == fresh)
        fed, n = n, n + 1 + step % 4
    assert same == steps


def test_head_starts_over_from_a_window_of_features(smollm, head, prompts, plain):
    """Features from a later position only (a restarted drafter, a window): it still drafts, and the same
    as a fresh drafter given that window; without the feature of the newest position it drafts nothing."""
    cfg = EngineConfig(kv_cache_tokens=4096, k=4)
    tokens = prompts[1] + plain[1].new_token_ids
    aux = _features(smollm, head, tokens)
    n, w = len(tokens) - 10, 24
    short = EagleDrafter("s", head, cfg)
    assert short.propose([DraftRequest("r", tokens[: n + 1], 4, GREEDY, aux[: n - 1], 0)]).token_ids[0] == []
    d = EagleDrafter("w", head, cfg)
    got = d.propose([DraftRequest("r", tokens[: n + 1], 4, GREEDY, aux[n - w: n], n - w)]).token_ids[0]
    fresh = EagleDrafter("f", head, cfg).propose(
        [DraftRequest("f", tokens[: n + 1], 4, GREEDY, aux[n - w: n], n - w)]).token_ids[0]
    assert len(got) == 4 and got == fresh
    # and continues from there as new features arrive
    more = d.propose([DraftRequest("r", tokens[: n + 3], 4, GREEDY, aux[n: n + 2], n)]).token_ids[0]
    assert len(more) == 4


def test_head_forwards_with_feature_rows_take_the_graph_buckets(smollm, head, prompts):
    """With the static path on (captured on a GPU, eager here) the head's own forwards run in graph buckets
    that take a feature row per token: its catch-up over prompts in prefill buckets, its draft steps in
    uniform-step buckets, and a round mixing both. Each gives what the paged eager path gives."""
    def runner(graphs: bool) -> ModelRunner:
        return ModelRunner(head, EngineConfig(kv_cache_tokens=4096, max_batch_size=4, max_context=1024, k=4,
                                              cuda_graphs=graphs))

    eager, static = runner(False), runner(True)
    a, b = prompts[0], prompts[1]
    fa, fb = (head.fuse_features(_features(smollm, head, t)) for t in (a, b))

    def same(chunks, features):
        want, got = eager.run(chunks, features=features), static.run(chunks, features=features)
        torch.testing.assert_close(got.logits, want.logits, atol=2e-3, rtol=1e-4)
        torch.testing.assert_close(got.hidden, want.hidden, atol=2e-4, rtol=1e-4)
        assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))
        return want

    out = same([Chunk("a", a[:-1]), Chunk("b", b[:-4])], torch.cat([fa[:-1], fb[:-4]]))  # two catch-ups
    assert static.prefill_graphs._buckets and not static.graphs._buckets
    for _ in range(2):  # draft steps: a token each, fed the head's previous output
        out = same([Chunk("a", [a[-1]]), Chunk("b", [b[-4]])], out.hidden)
    # a round mixing a draft step (a) and a chunk of three tokens (b): a step row beside a prefill bucket
    same([Chunk("a", [7]), Chunk("b", b[-3:])], torch.cat([out.hidden[:1], fb[-3:]]))
    width = fa.shape[1]
    assert all(key[-1] == width for key in [*static.graphs._buckets, *static.prefill_graphs._buckets])
    assert (2, 1, 512, (), width) in static.graphs._buckets and (1, 32, 512, (), width) in static.prefill_graphs._buckets


def test_a_drafter_services_catch_ups_take_buckets_built_up_front():
    """A drafter service's rounds catch its head up over each row's committed tokens (2 .. k + 1 of them, deep in
    the sequence): ``capture_chunks`` builds those buckets up front (on a GPU, with the head's other graphs before
    SERVING), so a greedy and a sampled row drafted together, round after round, build none of their own."""
    from drafter_svc.main import build
    from drafter_svc.service import DraftItem
    from drafter_svc.settings import DrafterSettings
    from engine.drafters.eagle import STEP_CAPTURE_ROWS

    settings = DrafterSettings(device="cpu", draft="auto")
    engine = build(settings, dataclasses.replace(settings.engine_config(wire=True), cuda_graphs=True))
    pg, width = engine.drafter.runner.prefill_graphs, engine.drafter.head.config.hidden_size  # fused features
    pg.capture_prompts(features=width)  # as EagleDrafter.capture_prefills does on a GPU (the CPU skips it)
    assert pg.capture_chunks(STEP_CAPTURE_ROWS, features=width) == 8  # 1, 2, 4, 8 rows x 2 contexts
    before = set(pg._buckets)
    feats = lambda n: torch.randn(n, engine.feature_size)  # noqa: E731  (the target's layers, as the wire sends)
    rows = (("a", GREEDY, list(range(10, 40))), ("b", SamplingParams(temperature=0.9, seed=7), list(range(50, 67))))
    out = engine.draft([DraftItem(rid, 0, toks, 4, p, feats(len(toks) - 1), 0) for rid, p, toks in rows])
    for step in range(3):
        starts = {rid: len(toks) + 2 * step for rid, _, toks in rows}
        out = engine.draft([DraftItem(rid, starts[rid], [5, 6], 4, p, feats(2), starts[rid] - 1)
                            for rid, p, _ in rows])
        assert all(len(d.tokens) == 4 for d in out), out
    out = engine.draft([DraftItem("a", 36, [7, 8, 9], 4, GREEDY, feats(3), 35)])  # one row, three tokens
    assert len(out[0].tokens) == 4
    assert set(pg._buckets) == before
