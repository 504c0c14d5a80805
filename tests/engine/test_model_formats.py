"""Checkpoint formats: tiny random Llama-family models, written the way transformers and llama.cpp write
them, load to the same logits as transformers' own model on the same weights (float32, CPU).

Hugging Face directories come from ``save_pretrained`` (tied / untied head, llama3 rope scaling, Qwen2
qkv bias, Mistral, sharded safetensors). GGUF files come from ``gguf.GGUFWriter`` with the tensor
types F32, F16, BF16, Q8_0, Q4_0 and Q4_1, q/k rows permuted as llama.cpp's converter permutes them,
the tokenizer metadata copied from the real SmolLM2 GGUF and, for llama3 scaling, a ``rope_freqs``
tensor computed the way the converter computes it. The transformers reference for a GGUF holds the
quantization round trip of the original weights, un-permuted by the test itself.

The GGUF writer lives in tests/engine/gguf_writer.py. The files are read by Tandem's own parser
(engine/models/weights/gguf_file.py); writing them copies SmolLM2's tokenizer metadata (100k strings),
so there are three GGUF files, each one model variant (llama untied + rope_freqs, qwen2
with biases, mistral tied) with its tensors in two types, as llama.cpp mixes types within a file.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gguf import GGMLQuantizationType as QT  # noqa: E402

from engine.assets import default_model_path  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.models.llama import LlamaForCausalLM as OurLlama  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from engine.models.weights import gguf_loader  # noqa: E402
from engine.runner import Chunk, ModelRunner  # noqa: E402
from tests.engine.gguf_writer import layer_types, llama3_rope_factors, write_gguf  # noqa: E402

VOCAB = 49152  # the SmolLM2 tokenizer's
DIMS = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5)
SEQ_LEN, PREFILL = 48, 44  # prefill 44 tokens, then decode 4 one at a time
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=50000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
TEXT = "def quicksort(items):\n    return sorted(items)  # 12345 héllo, world!"


# ---------------------------------------------------------------------------------------------- helpers

def hf_model(kind: str = "llama", seed: int = 0, rope: dict | None = None, **overrides):
    """A random transformers model, every parameter (norms and biases included) drawn from ``seed``."""
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[kind]
    kw = {**DIMS, **overrides}
    kw["rope_parameters"] = rope or {"rope_type": "default", "rope_theta": 100000.0}
    config = cfg_cls(**kw)
    config._attn_implementation = "eager"
    model = model_cls(config).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * r)
            elif name.endswith(".bias"):
                p.copy_(0.5 * r)
            elif "embed_tokens" in name:
                p.copy_(0.5 * r)
            else:  # unit-variance outputs: non-trivial attention patterns and logits
                p.copy_(r / math.sqrt(p.shape[1]))
    if kind == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    return model


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def our_logits(loaded, ids: list[int], prefill: int = PREFILL) -> torch.Tensor:
    """Prefill ``ids[:prefill]`` (all logits), then decode the rest one token at a time through the paged KV."""
    runner = ModelRunner(loaded.model, EngineConfig(kv_cache_tokens=256, kv_block_size=8))
    parts = [runner.forward([Chunk("s", ids[:prefill], num_logits=prefill)])]
    for t in ids[prefill:]:
        parts.append(runner.forward([Chunk("s", [t])]))
    return torch.cat(parts)


def assert_logits_match(ours: torch.Tensor, ref: torch.Tensor, atol: float = 1e-4) -> None:
    assert ours.shape == ref.shape
    diff = (ours - ref).abs().max().item()
    assert diff <= atol, f"max abs logit diff {diff:.3g} > {atol}"
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def random_ids(seed: int, n: int = SEQ_LEN) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def hf_rope_table(model, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' cos/sin for positions [0, n): [n, head_dim / 2] each (its halves are duplicates)."""
    half = model.config.head_dim // 2
    x = torch.zeros(1, n, model.config.head_dim)
    cos, sin = model.model.rotary_emb(x, torch.arange(n)[None])
    return cos[0, :, :half].float(), sin[0, :, :half].float()


def our_rope_table(loaded, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return loaded.model.model.rotary.cos_sin[:n].float().chunk(2, dim=-1)


def assert_rope_matches(loaded, ref, n: int) -> None:
    ours, theirs = our_rope_table(loaded, n), hf_rope_table(ref, n)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    # the scaled table is far from the plain one: the comparison above could tell them apart
    d = ref.config.head_dim
    theta = ref.config.rope_parameters["rope_theta"]
    plain = torch.outer(torch.arange(n, dtype=torch.float64), theta ** (-torch.arange(0, d, 2) / d)).cos().float()
    assert (plain - theirs[0]).abs().max() > 0.5


def write_hf_dir(directory: Path, model, tokenizer_dir: Path, **save_kwargs) -> Path:
    model.save_pretrained(directory, **save_kwargs)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, directory / f.name)
    return directory


def set_weights(model, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name])


# --------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def smollm_gguf() -> Path:
    return default_model_path(quiet=True)


@pytest.fixture(scope="module")
def hf_tokenizer(smollm_gguf, tmp_path_factory):
    """transformers' tokenizer of the SmolLM2 GGUF (slow: once per module) and the directory it was saved to."""
    tok = transformers.AutoTokenizer.from_pretrained(str(smollm_gguf.parent), gguf_file=smollm_gguf.name)
    directory = tmp_path_factory.mktemp("tokenizer")
    tok.save_pretrained(directory)
    assert (directory / "tokenizer.json").is_file()
    return tok, directory


@pytest.fixture(scope="module")
def tokenizer_kv(smollm_gguf) -> list:
    """The SmolLM2 GGUF's tokenizer metadata as (key, value, gguf types)."""
    f = gguf_loader.open_gguf(smollm_gguf)
    types = gguf.GGUFReader(str(smollm_gguf)).fields  # the value types the writer needs, from gguf's own reader
    keys = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"]
    out = [(k, f.metadata[k], list(types[k].types)) for k in keys]
    assert len(f.metadata["tokenizer.ggml.tokens"]) == VOCAB
    return out


# ------------------------------------------------------------------------------------ HF directories

HF_CASES = {
    "llama-tied": dict(kind="llama", tie_word_embeddings=True),
    "llama-untied-llama3-rope": dict(kind="llama", tie_word_embeddings=False, rope=LLAMA3_ROPE),
    "qwen2-qkv-bias": dict(kind="qwen2", tie_word_embeddings=False),
    "mistral": dict(kind="mistral", tie_word_embeddings=False),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_directory_matches_transformers(case, hf_tokenizer, tmp_path):
    spec = dict(HF_CASES[case])
    ref = hf_model(spec.pop("kind"), seed=len(case), **spec)
    directory = write_hf_dir(tmp_path / case, ref, hf_tokenizer[1])
    assert not (directory / "model.safetensors.index.json").exists()

    loaded = load_model(directory, progress=False)
    c = loaded.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (2, 64, 4, 2, 16, VOCAB)
    assert c.tie_word_embeddings == ref.config.tie_word_embeddings
    assert (loaded.model.lm_head is None) == c.tie_word_embeddings
    assert c.attention_bias == (case == "qwen2-qkv-bias")
    assert c.rope_theta == ref.config.rope_parameters["rope_theta"]
    if "llama3" in case:
        assert c.rope_scaling.kind == "llama3" and c.rope_theta == 50000.0
        assert_rope_matches(loaded, ref, DIMS["max_position_embeddings"])

    ids = random_ids(seed=len(case))
    assert_logits_match(our_logits(loaded, ids), reference_logits(ref, ids))
    tok = hf_tokenizer[0]
    assert loaded.tokenizer.encode(TEXT, add_special_tokens=False) == tok(TEXT, add_special_tokens=False).input_ids


@pytest.fixture(scope="module")
def sharded_dir(hf_tokenizer, tmp_path_factory):
    ref = hf_model("llama", seed=7, num_hidden_layers=3, tie_word_embeddings=False)
    directory = write_hf_dir(tmp_path_factory.mktemp("sharded"), ref, hf_tokenizer[1], max_shard_size="1MB")
    return ref, directory


def test_sharded_hf_directory(sharded_dir):
    ref, directory = sharded_dir
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3 and all((directory / s).is_file() for s in shards)
    assert not (directory / "model.safetensors").exists()
    loaded = load_model(directory, progress=False)
    assert loaded.config.num_layers == 3 and not loaded.config.tie_word_embeddings
    ids = random_ids(seed=7)
    assert_logits_match(our_logits(loaded, ids), reference_logits(ref, ids))


def test_max_layers_keeps_the_first_layers(sharded_dir):
    """``max_layers`` (smaller drafts) = the same checkpoint cut after its first layers, final norm and head kept."""
    ref, directory = sharded_dir
    loaded = load_model(directory, progress=False, max_layers=2)
    assert loaded.config.num_layers == 2 and len(loaded.model.model.layers) == 2
    cut = hf_model("llama", seed=0, num_hidden_layers=2, tie_word_embeddings=False)
    set_weights(cut, dict(ref.named_parameters()))
    ids = random_ids(seed=8)
    assert_logits_match(our_logits(loaded, ids), reference_logits(cut, ids))
    assert (reference_logits(cut, ids) - reference_logits(ref, ids)).abs().max() > 1e-2


# ------------------------------------------------------------------------------------------- GGUF files

# Three files (each costs ~5 s, see the module docstring), one architecture variant each, every tensor
# type in two of them: the embedding, the head and each layer in its own type, as llama.cpp mixes types.
GGUF_CASES = {
    "llama-untied-rope_freqs-F32-F16": dict(arch="llama", tie_word_embeddings=False, rope=LLAMA3_ROPE,
                                            types=layer_types(QT.F32, QT.F16, (QT.F16, QT.F32))),
    "qwen2-bias-BF16-Q8_0": dict(arch="qwen2", tie_word_embeddings=False,
                                 types=layer_types(QT.Q8_0, QT.BF16, (QT.BF16, QT.Q8_0))),
    "mistral-tied-Q4_0-Q4_1": dict(arch="mistral", tie_word_embeddings=True,
                                   types=layer_types(QT.Q4_1, None, (QT.Q4_0, QT.Q4_1))),
}
F32_ONLY = layer_types(QT.F32, QT.F32, (QT.F32,))


def test_gguf_cases_cover_every_tensor_type():
    names = ["model.embed_tokens.weight", "lm_head.weight"] + [f"model.layers.{i}.mlp.up_proj.weight"
                                                               for i in range(DIMS["num_hidden_layers"])]
    used = {case["types"](n) for case in GGUF_CASES.values() for n in names} - {None}
    assert used == {QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_matches_transformers(case, tokenizer_kv, hf_tokenizer, tmp_path):
    spec = dict(GGUF_CASES[case])
    qtype_of, arch, rope = spec.pop("types"), spec.pop("arch"), spec.pop("rope", None)
    original = hf_model(arch, seed=100 + len(case), rope=rope, **spec)
    factors = llama3_rope_factors(DIMS["head_dim"], rope) if rope else None
    path = tmp_path / f"{case}.gguf"
    held = write_gguf(path, arch, original, qtype_of, tokenizer_kv, rope_freqs=factors)
    for name, p in original.named_parameters():  # the round trip changed the weights (except F32)
        if p.ndim == 2:
            assert torch.equal(held[name], p) == (qtype_of(name) == QT.F32), name

    # transformers on the weights the file holds; for rope_freqs, the HF llama3 config they came from
    ref = hf_model(arch, seed=0, rope=rope, **spec)
    set_weights(ref, held)

    loaded = load_model(path, progress=False)
    c = loaded.config
    assert (c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim) == \
        (2, 64, 128, 4, 2, 16)
    assert c.vocab_size == VOCAB and c.max_position == 256
    assert c.tie_word_embeddings == spec["tie_word_embeddings"]
    assert (loaded.model.lm_head is None) == c.tie_word_embeddings
    assert c.attention_bias == (arch == "qwen2")
    assert c.rms_norm_eps == pytest.approx(1e-5) and c.rope_theta == ref.config.rope_parameters["rope_theta"]

    # every weight dequantized (and q/k un-permuted) exactly as the test did it
    ours = dict(loaded.model.named_parameters())
    for i in range(c.num_layers):
        pre = f"model.layers.{i}."
        what = f"layer {i} ({qtype_of(pre + 'mlp.up_proj.weight').name})"
        qkv = torch.cat([held[pre + f"self_attn.{p}_proj.weight"] for p in "qkv"])
        assert torch.equal(ours[pre + "self_attn.qkv_proj.weight"], qkv), f"{what} q/k/v"
        if c.attention_bias:
            qkv_b = torch.cat([held[pre + f"self_attn.{p}_proj.bias"] for p in "qkv"])
            assert torch.equal(ours[pre + "self_attn.qkv_proj.bias"], qkv_b), f"{what} q/k/v bias"
        assert torch.equal(ours[pre + "self_attn.o_proj.weight"], held[pre + "self_attn.o_proj.weight"]), what
        gate_up = torch.cat([held[pre + "mlp.gate_proj.weight"], held[pre + "mlp.up_proj.weight"]])
        assert torch.equal(ours[pre + "mlp.gate_up_proj.weight"], gate_up), f"{what} gate/up"
        assert torch.equal(ours[pre + "mlp.down_proj.weight"], held[pre + "mlp.down_proj.weight"]), what
        for norm in ("input_layernorm", "post_attention_layernorm"):
            assert torch.equal(ours[pre + norm + ".weight"], held[pre + norm + ".weight"]), what
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        if name in held:
            assert torch.equal(ours[name], held[name]), name

    if rope:
        assert_rope_matches(loaded, ref, c.max_position)
    ids = random_ids(seed=len(case))
    assert_logits_match(our_logits(loaded, ids), reference_logits(ref, ids))
    tok = hf_tokenizer[0]
    assert loaded.tokenizer.encode(TEXT, add_special_tokens=False) == tok(TEXT, add_special_tokens=False).input_ids


def test_gguf_rope_freqs_stay_float32_in_a_bfloat16_model(tmp_path):
    """The rotary table is float32 whatever the model dtype, so llama3 factors must not be rounded to it
    (bfloat16 factors put Llama 3.1's rotary angles ~0.8 rad off at 128k positions)."""
    original = hf_model("llama", seed=9, rope=LLAMA3_ROPE)
    path = tmp_path / "rope.gguf"
    write_gguf(path, "llama", original, F32_ONLY, None, rope_freqs=llama3_rope_factors(DIMS["head_dim"], LLAMA3_ROPE))
    f = gguf_loader.open_gguf(path)
    config = gguf_loader.model_config(f)
    model = OurLlama(config).to(torch.bfloat16)  # what load_model(dtype=torch.bfloat16) builds
    model.model.rotary.rebuild()
    model.load_weights(gguf_loader.iter_tensors(f, config, torch.bfloat16, progress=False))
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert_rope_matches(SimpleNamespace(model=model), original, config.max_position)


# ------------------------------------------------------------------------------------------ error cases

def _gguf_weights(path: Path):
    """Our model's loading of a GGUF without going through its (slow) tokenizer metadata."""
    f = gguf_loader.open_gguf(path)
    config = gguf_loader.model_config(f)
    model = OurLlama(config)
    return model, gguf_loader.iter_tensors(f, config, torch.float32, progress=False)


def test_gguf_unsupported_architecture(tmp_path):
    path = tmp_path / "falcon.gguf"
    w = gguf.GGUFWriter(str(path), "falcon")
    w.add_uint32("falcon.block_count", 1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="falcon"):
        load_model(path, progress=False)


def test_the_gguf_parser_reads_what_the_gguf_packages_reader_reads(smollm_gguf, tmp_path):
    """engine/models/weights/gguf_file.py against gguf.GGUFReader on the real SmolLM2 file: every metadata value
    (with its Python type) and every tensor (name, type, shape, the raw data dequantization starts from)."""
    ours = gguf_loader.open_gguf(smollm_gguf)
    ref = gguf.GGUFReader(str(smollm_gguf))
    want = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata.keys() == want.keys()
    assert all(ours.metadata[k] == v and type(ours.metadata[k]) is type(v) for k, v in want.items())
    assert [(t.name, t.tensor_type, list(t.shape)) for t in ours.reader.tensors] == \
        [(t.name, t.tensor_type, list(t.shape)) for t in ref.tensors]
    for a, b in zip(ours.reader.tensors, ref.tensors):
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape and np.array_equal(a.data, b.data)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm_gguf.read_bytes()[:100_000])  # inside the tokenizer's strings
    with pytest.raises(ValueError, match="cut.gguf: not a readable GGUF file"):
        gguf_loader.open_gguf(cut)


def test_gguf_missing_and_unexpected_weights(tmp_path):
    model = hf_model("llama", seed=3)
    path = tmp_path / "ok.gguf"
    held = write_gguf(path, "llama", model, F32_ONLY, None)
    ours, weights = _gguf_weights(path)
    ours.load_weights(weights)  # the complete file loads, to the same values
    assert torch.equal(ours.model.layers[1].mlp.down_proj.weight, held["model.layers.1.mlp.down_proj.weight"])

    write_gguf(tmp_path / "missing.gguf", "llama", model, F32_ONLY, None, skip=("model.layers.1.mlp.up_proj.weight",))
    ours, weights = _gguf_weights(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match=r"missing.*model\.layers\.1\.mlp\.gate_up_proj"):
        ours.load_weights(weights)

    write_gguf(tmp_path / "norm.gguf", "llama", model, F32_ONLY, None, skip=("model.norm.weight",))
    ours, weights = _gguf_weights(tmp_path / "norm.gguf")
    with pytest.raises(ValueError, match=r"missing.*model\.norm\.weight"):
        ours.load_weights(weights)

    write_gguf(tmp_path / "extra.gguf", "llama", model, F32_ONLY, None,
               extra={"blk.0.ffn_gate_exps.weight": np.zeros((4, 32), dtype=np.float32)})
    ours, weights = _gguf_weights(tmp_path / "extra.gguf")
    with pytest.raises(ValueError, match="ffn_gate_exps"):
        ours.load_weights(weights)


def test_hf_directory_without_config(hf_tokenizer, tmp_path):
    directory = write_hf_dir(tmp_path / "m", hf_model("llama", seed=4), hf_tokenizer[1])
    (directory / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(directory, progress=False)


def test_hf_index_names_a_missing_shard(sharded_dir, tmp_path):
    _, source = sharded_dir
    directory = Path(shutil.copytree(source, tmp_path / "m"))
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    gone = index["weight_map"]["model.layers.1.self_attn.o_proj.weight"]
    (directory / gone).unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(gone)):
        load_model(directory, progress=False)


def test_hf_checkpoint_missing_a_weight(hf_tokenizer, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = write_hf_dir(tmp_path / "m", hf_model("llama", seed=5), hf_tokenizer[1])
    tensors = load_file(directory / "model.safetensors")
    del tensors["model.layers.0.self_attn.o_proj.weight"]
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing.*model\.layers\.0\.self_attn\.o_proj\.weight"):
        load_model(directory, progress=False)


def test_sliding_window_caps_the_context(tmp_path):
    """Mistral-style sliding windows: the context is capped at the window, where full attention is exact."""
    import json

    from engine.models.weights.hf_loader import model_config

    base = {"model_type": "mistral", "vocab_size": 32, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps({**base, "sliding_window": 4096}))
    assert model_config(tmp_path).max_position == 4096
    (tmp_path / "config.json").write_text(json.dumps({**base, "sliding_window": None}))
    assert model_config(tmp_path).max_position == 32768
    (tmp_path / "config.json").write_text(json.dumps({**base, "model_type": "qwen2", "sliding_window": 4096,
                                                      "use_sliding_window": False}))
    assert model_config(tmp_path).max_position == 32768


@pytest.mark.parametrize("qtype", [QT.Q4_1, QT.Q8_0])
def test_whole_tensor_dequantization_is_the_gguf_packages_bit_for_bit(qtype, smollm_gguf):
    """gguf_loader.dequantize runs Q4_1 and Q8_0 over whole tensors: the same bits as the package's own, on random
    blocks (a block of zeros among them) and on every tensor of SmolLM2's file of that type (it holds both)."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal((64, 256)).astype(np.float32) * 3
    values[0] = 0.0
    raw = gguf.quants.quantize(values, qtype)
    tensors = [raw] + [t.data for t in gguf_loader.open_gguf(smollm_gguf).reader.tensors if t.tensor_type == qtype]
    assert len(tensors) > 1
    for data in tensors:
        want = gguf.quants.dequantize(data, qtype).reshape(-1)
        got = gguf_loader.dequantize(data, qtype).reshape(-1)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
