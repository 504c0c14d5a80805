"""``synthetic:`` targets: the published Llama-3.2-1B / Llama-3.1-8B shapes with seeded random weights.

CPU and small: the 8B shape is checked as a config, on the meta device (every parameter, no memory), as a
config-only directory and built with its first layer in bfloat16 (~2.5 GB: the embedding and the untied
head); the 1B shape runs with its first 2 layers in float32 (~1.5 GB: the 128,256 x 2,048 embedding is
most of it), through Tandem's engine and, exported, through transformers. The 8B tests come first, so the
1B model (a module fixture) is not held beside the 8B layer: a test process peaks at ~4 GB.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from engine.config import EngineConfig, ModelConfig, RopeScaling, SamplingParams  # noqa: E402
from engine.models import synthetic  # noqa: E402
from engine.models.layers import inv_freq  # noqa: E402
from engine.models.llama import LlamaForCausalLM  # noqa: E402
from engine.models.loader import load_model, model_source  # noqa: E402
from engine.models.weights.hf_writer import save_hf  # noqa: E402
from engine.runner import Chunk, ModelRunner  # noqa: E402
from tests.conftest import make_decoder  # noqa: E402

PUBLISHED = {  # huggingface.co/meta-llama/<name>/blob/main/config.json
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32, num_kv_heads=8,
                         head_dim=64, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0,
                         rope_scaling=RopeScaling(kind="llama3", factor=32.0, low_freq_factor=1.0,
                                                  high_freq_factor=4.0, original_max_position=8192),
                         max_position=131072, rms_norm_eps=1e-5, attention_bias=False),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                         head_dim=128, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0,
                         rope_scaling=RopeScaling(kind="llama3", factor=8.0, low_freq_factor=1.0,
                                                  high_freq_factor=4.0, original_max_position=8192),
                         max_position=131072, rms_norm_eps=1e-5, attention_bias=False),
}
PARAMETERS = {"llama-3.2-1b": 1_235_814_400, "llama-3.1-8b": 8_030_261_248}  # as published (1.24B, 8.03B)
ONE_B = "synthetic:llama-3.2-1b:layers=2"
PROMPTS = [[{"role": "user", "content": "Why is the sky blue?"}], "def fibonacci(n):\n    "]


def tandem(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def one_b():
    return load_model(ONE_B, progress=False)  # float32 on the CPU


@pytest.fixture(scope="module")
def prompt_ids(one_b) -> list[list[int]]:
    tok = one_b.tokenizer
    return [tok.encode_chat(p) if isinstance(p, list) else tok.encode(p) for p in PROMPTS]


# --------------------------------------------------------------------------------------------- configs

@pytest.mark.parametrize("name", list(PUBLISHED))
def test_config_is_the_published_one(name, smollm):
    loaded = load_model(f"synthetic:{name}", load_weights=False, progress=False)
    c = loaded.config
    assert {k: getattr(c, k) for k in PUBLISHED[name]} == PUBLISHED[name]
    assert loaded.model is None and loaded.synthetic and not smollm.synthetic
    assert loaded.source == f"synthetic:{name}" and c.name == loaded.source and loaded.total_layers == c.num_layers
    # the default model's tokenizer: every id it makes is a valid id of the 128,256-token vocabulary
    assert loaded.tokenizer.same_vocab(smollm.tokenizer) is None and loaded.tokenizer.vocab_size <= c.vocab_size


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_every_parameter_has_the_published_shape(name):
    """On the meta device (no memory): Tandem's model and transformers' from the exported config.json hold
    the published parameter count."""
    config = synthetic.model_config(synthetic.parse(f"synthetic:{name}"))
    with torch.device("meta"):
        ours = LlamaForCausalLM(config)
        hf_config = transformers.LlamaConfig(**synthetic.published_config(name))
        theirs = transformers.LlamaForCausalLM(hf_config)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters()) == PARAMETERS[name]


def test_specs_and_model_source():
    spec = synthetic.parse("synthetic:Llama-3.2-1B:layers=3:seed=7")
    assert (spec.name, spec.layers, spec.seed, str(spec)) == ("llama-3.2-1b", 3, 7,
                                                             "synthetic:llama-3.2-1b:layers=3:seed=7")
    assert synthetic.model_config(spec).num_layers == 3
    assert model_source("synthetic:llama-3.1-8b") == "synthetic:llama-3.1-8b"  # text, not a Path
    assert model_source("models/x.gguf") == Path("models/x.gguf")
    assert load_model("synthetic:llama-3.1-8b", load_weights=False, max_layers=4, progress=False).config.num_layers == 4


@pytest.mark.parametrize("text, message", [
    ("synthetic:llama-9b", "model: unknown synthetic model 'llama-9b' (known: synthetic:llama-3.2-1b, "
                           "synthetic:llama-3.1-8b)"),
    ("synthetic:", "model: unknown synthetic model ''"),
    ("synthetic:llama-3.2-1b:layers=17", "layers must be in [1, 16], got 17"),
    ("synthetic:llama-3.1-8b:layers=0", "layers must be in [1, 32], got 0"),
    ("synthetic:llama-3.2-1b:layers=two", "layers takes an integer, got 'two'"),
    ("synthetic:llama-3.2-1b:depth=2", "option 'depth=2' is not layers=N or seed=S"),
    ("synthetic:llama-3.2-1b:seed=-1", "seed must be in [0, 2**31)"),
])
def test_bad_specs_name_the_field(text, message):
    with pytest.raises(ValueError) as err:
        load_model(text, load_weights=False, progress=False)
    assert str(err.value).startswith("model: ") and message in str(err.value)


def test_the_cli_reports_a_bad_name(tmp_path):
    proc = tandem("export-hf", "--model", "synthetic:llama-70b", "--out", str(tmp_path / "x"), "--config-only")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "model: unknown synthetic model 'llama-70b' (known: synthetic:llama-3.2-1b" in proc.stderr


# ---------------------------------------------------------------------------------------- the 8B shape

def test_config_only_directory_for_vllm(tmp_path):
    """What vLLM's load_format="dummy" reads: config.json and the tokenizer, no 16 GB of weights."""
    out = synthetic.hf_directory("llama-3.1-8b", tmp_path / "api")
    assert sorted(f.name for f in out.iterdir()) == ["config.json", "generation_config.json", "tokenizer.json",
                                                      "tokenizer_config.json"]
    proc = tandem("export-hf", "--model", "synthetic:llama-3.1-8b", "--out", str(tmp_path / "cli"), "--config-only")
    assert proc.returncode == 0, proc.stderr
    for f in out.iterdir():
        assert (tmp_path / "cli" / f.name).read_text() == f.read_text(), f.name
    cfg = transformers.AutoConfig.from_pretrained(str(out))
    assert (cfg.architectures, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim,
            cfg.vocab_size, cfg.tie_word_embeddings, cfg.dtype) == (
        ["LlamaForCausalLM"], 32, 4096, 8, 128, 128256, False, torch.bfloat16)
    assert cfg.rope_parameters["rope_type"] == "llama3" and cfg.rope_parameters["factor"] == 8.0
    assert transformers.AutoTokenizer.from_pretrained(str(out)).chat_template
    back = load_model(out, load_weights=False, progress=False)
    expected = synthetic.model_config(synthetic.parse("synthetic:llama-3.1-8b"))
    assert back.config == ModelConfig(**{**expected.__dict__, "name": back.config.name})


def test_one_layer_of_the_8b_shape_in_bfloat16():
    """Its first layer, the embedding and the untied head: 1.27B parameters, ~2.5 GB, made in bfloat16."""
    loaded = load_model("synthetic:llama-3.1-8b:layers=1", dtype=torch.bfloat16, progress=False)
    params = list(loaded.model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in params)
    h, v, ffn, kv = 4096, 128256, 14336, 8 * 128
    assert sum(p.numel() for p in params) == 2 * v * h + (h * (h + 2 * kv) + h * h + 3 * h * ffn + 2 * h) + h
    assert loaded.model.lm_head is not None and not torch.equal(loaded.model.lm_head.weight,
                                                                loaded.model.model.embed_tokens.weight)
    ids = loaded.tokenizer.encode("Hello, world")
    logits = ModelRunner(loaded.model, EngineConfig(dtype="bfloat16", kv_cache_tokens=64)).forward(
        [Chunk("s", ids, num_logits=len(ids))])
    assert logits.shape == (len(ids), v) and torch.isfinite(logits).all()


# ------------------------------------------------------------------------------ the 1B shape, 2 layers

def test_weights_are_seeded_and_initialised_like_transformers(one_b):
    params = dict(one_b.model.named_parameters())
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params.values())
    for name, p in params.items():
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            assert abs(p.std().item() - 0.02) < 2e-4 and abs(p.mean().item()) < 2e-4, name
    # the same spec gives the same weights; layers=1 is the first layer of layers=2
    again = load_model("synthetic:llama-3.2-1b:layers=1", progress=False)
    for name, p in again.model.named_parameters():
        assert torch.equal(p, params[name]), name
    synthetic.init_weights(again.model, seed=1, progress=False)  # another seed, other weights
    assert not torch.equal(again.model.model.embed_tokens.weight, params["model.embed_tokens.weight"])


def test_greedy_decoding_through_the_engine(one_b, prompt_ids):
    greedy = SamplingParams(max_tokens=10, ignore_eos=True)
    plain = make_decoder(one_b, "none", kv_cache_tokens=512).generate(prompt_ids, greedy)
    assert [len(o.new_token_ids) for o in plain] == [10, 10]
    assert all(0 <= t < 128256 for o in plain for t in o.new_token_ids)
    # greedy is the argmax of a full forward, and speculative rounds on a random target commit the same tokens
    ids = prompt_ids[1] + plain[1].new_token_ids
    logits = ModelRunner(one_b.model, EngineConfig(kv_cache_tokens=512)).forward(
        [Chunk("s", ids, num_logits=len(ids))])
    assert logits[len(prompt_ids[1]) - 1:-1].argmax(-1).tolist() == plain[1].new_token_ids
    spec = make_decoder(one_b, "layerskip:1", k=3, kv_cache_tokens=512).generate(prompt_ids, greedy)
    assert [o.new_token_ids for o in spec] == [o.new_token_ids for o in plain]


def test_transformers_on_the_export_gives_tandems_logits(one_b, prompt_ids, tmp_path):
    """The llama3 rope scaling (factor 32), grouped-query attention (32 / 8 heads of 64) and the 128,256-token
    tied head, through transformers on the exported weights."""
    save_hf(one_b.model, one_b.tokenizer, tmp_path, dtype=torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["vocab_size"] == 128256 and cfg["tie_word_embeddings"] is True
    assert cfg["rope_scaling"] == synthetic.CONFIGS["llama-3.2-1b"]["rope_scaling"]
    assert cfg["bos_token_id"] == one_b.tokenizer.bos_token_id  # SmolLM2's ids: its tokenizer is the one written
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    c = one_b.config
    theirs = hf.model.rotary_emb.inv_freq.float()
    torch.testing.assert_close(inv_freq(c.head_dim, c.rope_theta, c.rope_scaling), theirs, rtol=1e-6, atol=0)
    plain = inv_freq(c.head_dim, c.rope_theta, RopeScaling())
    assert theirs[-1].item() == pytest.approx(plain[-1].item() / 32, rel=1e-6)  # the lowest frequency, scaled
    runner = ModelRunner(one_b.model, EngineConfig(kv_cache_tokens=512))
    for i, ids in enumerate(prompt_ids):
        ours = runner.forward([Chunk(f"s{i}", ids, num_logits=len(ids))])
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        diff = (ours - ref).abs().max().item()
        assert diff < 1e-4, f"max abs logit diff {diff:.3g}"
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))
