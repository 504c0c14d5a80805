"""``tandem export-hf``: the real SmolLM2 written as a Hugging Face directory runs in transformers (and Tandem)
to the logits and token ids Tandem gets from the GGUF (float32, CPU).

Also: a bfloat16 export holds bfloat16 tensors, ``--config-only`` writes no weights, a model with q/k/v biases
is written as Qwen2, and a Llama 3 GGUF's ``rope_freqs`` become its llama3 ``rope_scaling``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from engine.config import EngineConfig, RopeScaling  # noqa: E402
from engine.models.export import export_hf  # noqa: E402
from engine.models.llama import LlamaForCausalLM as OurLlama  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from engine.models.weights import gguf_loader  # noqa: E402
from engine.models.weights.hf_writer import save_hf, with_rope_freqs  # noqa: E402
from engine.runner import Chunk, ModelRunner  # noqa: E402
from tests.engine.gguf_writer import layer_types, llama3_rope_factors, write_gguf  # noqa: E402

CHATS = [
    [{"role": "user", "content": "Explain what a hash table is, in two sentences."}],
    [{"role": "system", "content": "You answer in French."},
     {"role": "user", "content": "What is 12 * 7?"},
     {"role": "assistant", "content": "84."},
     {"role": "user", "content": "And 13 * 7?"}],
]
TEXTS = ["The three primary colors are red, yellow and",
         "def quicksort(items):\n    return sorted(items)  # 12345 héllo, world! <|im_end|>"]


def our_logits(model, ids: list[int]) -> torch.Tensor:
    runner = ModelRunner(model, EngineConfig(kv_cache_tokens=1024))
    return runner.forward([Chunk("s", ids, num_logits=len(ids))])


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def assert_logits_match(ours: torch.Tensor, ref: torch.Tensor, atol: float = 1e-4) -> None:
    assert ours.shape == ref.shape
    diff = (ours - ref).abs().max().item()
    assert diff < atol, f"max abs logit diff {diff:.3g} >= {atol}"
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.fixture(scope="module")
def exported(smollm_path, tmp_path_factory):
    """The default model exported in float32 by the CLI, as a user runs it."""
    out = tmp_path_factory.mktemp("smollm2-hf")
    proc = subprocess.run([sys.executable, "-m", "cli.main", "export-hf", "--out", str(out), "--model",
                           str(smollm_path), "--dtype", "float32"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    return out


@pytest.fixture(scope="module")
def prompt_ids(smollm) -> list[list[int]]:
    tok = smollm.tokenizer
    return [tok.encode_chat(CHATS[0]), tok.encode(TEXTS[1])]


def test_the_directory_has_what_transformers_and_vllm_read(exported, smollm):
    names = {f.name for f in exported.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= names
    cfg = json.loads((exported / "config.json").read_text())
    c = smollm.config
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert cfg["torch_dtype"] == cfg["dtype"] == "float32"
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["vocab_size"]) == (30, 576, 9, 3, 64, 49152)
    assert cfg["max_position_embeddings"] == c.max_position and cfg["rope_theta"] == c.rope_theta
    assert "rope_scaling" not in cfg and cfg["tie_word_embeddings"] is True
    assert cfg["bos_token_id"] == smollm.tokenizer.bos_token_id
    assert [cfg["eos_token_id"]] == sorted(smollm.tokenizer.eos_token_ids)
    tok_cfg = json.loads((exported / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == smollm.tokenizer.chat_template


def test_transformers_gives_tandems_logits(exported, smollm, prompt_ids):
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32).eval()
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.dtype == torch.float32
    for ids in prompt_ids:
        assert_logits_match(our_logits(smollm.model, ids), hf_logits(hf, ids))


def test_transformers_tokenizer_gives_tandems_ids(exported, smollm):
    hf = transformers.AutoTokenizer.from_pretrained(str(exported))
    tok = smollm.tokenizer
    for messages in CHATS:
        ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        assert ids["input_ids"] == tok.encode_chat(messages)
        assert hf.apply_chat_template(messages, add_generation_prompt=False, tokenize=False) == \
            tok.apply_chat_template(messages, add_generation_prompt=False)
    for text in TEXTS:
        assert hf(text).input_ids == tok.encode(text)
        assert hf(text, add_special_tokens=False).input_ids == tok.encode(text, add_special_tokens=False)
    assert hf.convert_tokens_to_ids(hf.eos_token) in tok.eos_token_ids


def test_tandem_reads_the_export_back(exported, smollm, prompt_ids):
    loaded = load_model(exported, progress=False)
    assert loaded.config == dataclasses.replace(smollm.config, name=loaded.config.name)
    ours = dict(smollm.model.named_parameters())
    for name, p in loaded.model.named_parameters():
        assert torch.equal(p, ours[name]), name
    for ids in prompt_ids:
        torch.testing.assert_close(our_logits(loaded.model, ids), our_logits(smollm.model, ids), atol=0, rtol=0)
    t = loaded.tokenizer
    assert t.same_vocab(smollm.tokenizer) is None and t.chat_template == smollm.tokenizer.chat_template
    assert t.eos_token_ids == smollm.tokenizer.eos_token_ids and t.bos_token_id == smollm.tokenizer.bos_token_id


def test_bfloat16_export_writes_bfloat16_tensors(exported, smollm_path, smollm, tmp_path):
    from safetensors import safe_open

    out = export_hf(smollm_path, tmp_path / "bf16")  # bfloat16 is the default
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    ours = dict(smollm.model.named_parameters())
    with safe_open(str(out / "model.safetensors"), framework="pt") as st, \
            safe_open(str(exported / "model.safetensors"), framework="pt") as f32:
        assert set(st.keys()) == set(f32.keys())
        for name in st.keys():
            t = st.get_tensor(name)
            assert t.dtype == torch.bfloat16, name
            assert torch.equal(t, f32.get_tensor(name).bfloat16()), name  # the float32 export, rounded
    back = load_model(out, dtype=torch.bfloat16, progress=False).model
    assert torch.equal(back.model.embed_tokens.weight, ours["model.embed_tokens.weight"].bfloat16())


def test_config_only_writes_no_weights(exported, smollm_path, tmp_path):
    out = export_hf(smollm_path, tmp_path / "config", dtype="float32", config_only=True)
    assert not (out / "model.safetensors").exists()
    assert json.loads((out / "config.json").read_text()) == json.loads((exported / "config.json").read_text())
    assert (out / "tokenizer.json").read_text() == (exported / "tokenizer.json").read_text()


def test_bad_dtype_names_the_field(smollm_path, tmp_path):
    with pytest.raises(ValueError, match="dtype: must be bfloat16 or float32"):
        export_hf(smollm_path, tmp_path / "x", dtype="float16")


# ------------------------------------------------------------------ other architectures, tiny random models

def _randomize(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * r if name.endswith("norm.weight") else
                    0.5 * r if name.endswith(".bias") or "embed" in name else r / math.sqrt(p.shape[-1]))


TINY = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5)
IDS = list(range(100, 4100, 97))


def test_a_model_with_qkv_biases_is_written_as_qwen2(smollm, tmp_path):
    ref = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TINY, tie_word_embeddings=False)).eval()
    _randomize(ref, seed=1)
    ref.save_pretrained(tmp_path / "src")
    smollm.tokenizer.save_hf(tmp_path / "src")
    out = export_hf(tmp_path / "src", tmp_path / "out", dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and "attention_bias" not in cfg
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen2ForCausalLM"
    assert_logits_match(hf_logits(hf, IDS), hf_logits(ref, IDS), atol=1e-5)
    assert_logits_match(our_logits(load_model(out, progress=False).model, IDS), hf_logits(ref, IDS))


LLAMA3 = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=8192)  # Llama 3.1's


def test_gguf_rope_freqs_become_llama3_rope_scaling(smollm, tmp_path):
    """llama.cpp stores Llama 3's rope scaling as rope_freqs; the export writes the rope_scaling behind them."""
    original = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **TINY, tie_word_embeddings=False, rope_parameters=LLAMA3)).eval()
    _randomize(original, seed=2)
    factors = llama3_rope_factors(TINY["head_dim"], LLAMA3)
    assert 1 < factors.max() == LLAMA3["factor"]
    path = tmp_path / "llama3.gguf"
    f32 = gguf.GGMLQuantizationType.F32
    write_gguf(path, "llama", original, layer_types(f32, f32, (f32,)), None, rope_freqs=factors)
    f = gguf_loader.open_gguf(path)
    config = gguf_loader.model_config(f)
    assert config.rope_scaling.kind == "none"  # the scaling is in the tensor, not the metadata
    model = OurLlama(config)
    model.model.rotary.rebuild()
    model.load_weights(gguf_loader.iter_tensors(f, config, torch.float32, progress=False))

    want = RopeScaling(kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192)
    assert with_rope_freqs(config, gguf_loader.rope_freqs(f)).rope_scaling == want  # what --config-only writes
    save_hf(model, smollm.tokenizer, tmp_path / "out", dtype=torch.float32)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32).eval()
    assert_logits_match(hf_logits(hf, IDS), hf_logits(original, IDS), atol=1e-5)
    assert_logits_match(our_logits(model, IDS), hf_logits(hf, IDS))

    with pytest.raises(ValueError, match="rope_freqs:"):  # factors of no published llama3 scaling
        with_rope_freqs(config, torch.full_like(gguf_loader.rope_freqs(f), 2.0))
