"""engine.tokenizer against transformers, on the real SmolLM2-135M-Instruct GGUF and ShareGPT texts.

The reference is transformers' own GGUF tokenizer with one correction: transformers builds the
pre-tokenizer of every GGUF byte-level BPE vocabulary as plain GPT-2 ``ByteLevel`` and ignores
``tokenizer.ggml.pre``. For ``smollm`` llama.cpp splits digits first (``\\p{N}``, then the GPT-2
regex), which is also what SmolLM2's real tokenizer.json does (``Digits(individual_digits=True)``
+ ``ByteLevel``). The reference gets that pre-tokenizer; everything else (vocabulary, merges,
added tokens, decoder) is transformers' conversion. ``test_smollm_digit_split_differs_from_transformers_gguf``
pins the difference.
"""

from __future__ import annotations

import copy
import inspect
import json
import random
import re

import pytest
from tokenizers import Regex, pre_tokenizers
from tokenizers import Tokenizer as RustTokenizer

from bench.datasets import sharegpt
from engine.assets import default_model_path
from engine.models.weights.gguf_loader import open_gguf
from engine.tokenizer import IncrementalDecoder, Tokenizer

SMOLLM_PRE = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
MULTIBYTE = ["数学很有趣。テストです！한국어 문장", "Emoji: 🙂👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 done",
             "Ünïcödé — “quotes” … ½ ² ① ٣٤٥ ４５", "Привет, мир! Γειά σου κόσμε"]


def pick_texts() -> list[str]:
    """A deterministic mix of ShareGPT turns: user, assistant, code, non-Latin scripts, emoji."""
    wanted = {"user": 50, "assistant": 50, "code": 40, "script": 40, "emoji": 20}
    kinds = {
        "code": lambda t: "```" in t,
        "script": lambda t: re.search(r"[\u0400-\u04ff\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af]", t),
        "emoji": lambda t: re.search(r"[\U0001F300-\U0001FAFF]", t),
    }
    picked: list[str] = []
    for conv in sharegpt(split="train", limit=3000):
        for role, text in conv.turns:
            if not text.strip() or text in picked:
                continue
            kind = next((k for k, test in kinds.items() if wanted[k] and test(text)), role)
            if wanted.get(kind, 0) > 0:
                wanted[kind] -= 1
                picked.append(text)
        if not any(wanted.values()):
            break
    assert len(picked) == 200 and not any(wanted.values()), wanted
    return picked


@pytest.fixture(scope="module")
def metadata() -> dict:
    return open_gguf(default_model_path(quiet=True)).metadata


@pytest.fixture(scope="module")
def tok(metadata) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(metadata, source="smollm2.gguf")


@pytest.fixture(scope="module")
def ref_gguf():
    """transformers' GGUF tokenizer, exactly as transformers builds it (loaded once: ~20 s)."""
    transformers = pytest.importorskip("transformers")
    path = default_model_path(quiet=True)
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def ref_raw_backend(ref_gguf) -> RustTokenizer:
    return RustTokenizer.from_str(ref_gguf.backend_tokenizer.to_str())


@pytest.fixture(scope="module")
def ref(ref_gguf):
    """The reference with SmolLM2's real pre-tokenizer (see the module docstring)."""
    fixed = copy.deepcopy(ref_gguf)
    fixed.backend_tokenizer.pre_tokenizer = SMOLLM_PRE
    return fixed


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return pick_texts()


@pytest.fixture(scope="module")
def hf_dir(ref, tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2_hf")
    ref.save_pretrained(out)
    return out


def first_mismatch(ours: list, theirs: list, texts: list[str]) -> str | None:
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return f"text {i} {texts[i][:60]!r}: {a if len(str(a)) < 300 else str(a)[:300]} vs {b}"
    return None


def test_smollm2_basics(tok):
    assert tok.vocab_size == 49152
    assert tok.bos_token_id == 1 and tok.add_bos is False
    assert 2 in tok.eos_token_ids and tok.eos_token_ids == frozenset({2})
    assert [tok.id_to_token(i) for i in (0, 1, 2)] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    with pytest.raises(IndexError):
        tok.id_to_token(tok.vocab_size)


def test_encode_matches_transformers(tok, ref, texts):
    ours = [tok.encode(t) for t in texts]
    theirs = [ref.encode(t) for t in texts]
    assert first_mismatch(ours, theirs, texts) is None
    assert sum(map(len, ours)) > 40_000  # a real workload, not 200 empty strings
    assert [tok.encode(t, add_special_tokens=False) for t in texts[:20]] == \
        [ref.encode(t, add_special_tokens=False) for t in texts[:20]]


def test_smollm_digit_split_differs_from_transformers_gguf(tok, ref_raw_backend):
    text = "Steps:\n\n1. Mix  2 cups"
    ours = [tok.id_to_token(i) for i in tok.encode(text)]
    raw = [tok.id_to_token(i) for i in ref_raw_backend.encode(text).ids]
    # llama.cpp 'smollm' / SmolLM2's tokenizer.json: "\n\n" ends a piece before the digit -> one token
    assert ours[ours.index("1") - 1] == "ĊĊ" and ours[ours.index("2") - 1] == "ĠĠ"
    # transformers' GGUF conversion has no digit split: the whitespace run is cut before "1"
    assert raw[raw.index("1") - 2: raw.index("1")] == ["Ċ", "Ċ"]
    assert tok.decode(tok.encode(text)) == text


def test_gpt2_pre_tokenizer_is_transformers_gguf_byte_level(metadata, ref_raw_backend, texts):
    gpt2 = Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.pre": "gpt2"})
    ours = [gpt2.encode(t) for t in texts]
    theirs = [ref_raw_backend.encode(t).ids for t in texts]
    assert first_mismatch(ours, theirs, texts) is None


@pytest.mark.parametrize("skip", [False, True])
def test_decode_matches_transformers(tok, ref, texts, skip):
    specials = [1, 2, 0, 5]
    ids = [ref.encode(t) for t in texts]
    ids = [x[:7] + specials[: i % 5] + x[7:] for i, x in enumerate(ids)]  # specials in the middle, too
    ours = [tok.decode(x, skip_special_tokens=skip) for x in ids]
    theirs = [ref.decode(x, skip_special_tokens=skip) for x in ids]
    assert first_mismatch(ours, theirs, texts) is None
    assert all(("<|im_start|>" in o) != skip for o, x in zip(ours, ids) if 1 in x)


def test_special_tokens_in_text(tok, ref):
    text = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<|endoftext|>"
    ids = tok.encode(text)
    assert ids == ref.encode(text)
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1 and ids[-1] == 0
    assert tok.encode(text, add_special_tokens=False) == ids  # SmolLM2 adds no BOS
    assert tok.decode(ids) == text and tok.decode(ids, skip_special_tokens=True) == "user\nHi there\nassistant\n"


def test_hf_dir_matches_gguf(tok, ref, hf_dir, texts):
    hf = Tokenizer.from_hf_dir(hf_dir)
    assert hf.vocab_size == tok.vocab_size and hf.bos_token_id == 1 and hf.add_bos is False
    assert hf.same_vocab(tok) is None and tok.same_vocab(hf) is None
    assert hf.chat_template == tok.chat_template
    ours = [hf.encode(t) for t in texts]
    assert first_mismatch(ours, [tok.encode(t) for t in texts], texts) is None
    assert first_mismatch([hf.decode(x) for x in ours[:50]], [ref.decode(x) for x in ours[:50]], texts) is None


def test_hf_dir_eos_and_bos_flags(hf_dir, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((hf_dir / name).read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["eos_token"] = {"content": "<|im_end|>", "special": True}  # AddedToken form
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_hf_dir(tmp_path).eos_token_ids == {2}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert Tokenizer.from_hf_dir(tmp_path).eos_token_ids == {0, 2}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert Tokenizer.from_hf_dir(tmp_path).eos_token_ids == {2, 5}
    config["add_bos_token"] = True  # transformers rebuilds the post-processor from this flag
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with_bos, plain = Tokenizer.from_hf_dir(tmp_path), Tokenizer.from_hf_dir(hf_dir)
    assert with_bos.add_bos and not plain.add_bos
    assert with_bos.encode("Hi") == [1] + plain.encode("Hi")
    assert with_bos.encode("Hi", add_special_tokens=False) == plain.encode("Hi")
    assert with_bos.same_vocab(plain) == "BOS prepended to raw text: 1 vs None"


def stream(tok: Tokenizer, ids: list[int], sizes, skip: bool = False) -> tuple[list[str], str]:
    dec = IncrementalDecoder(tok, skip_special_tokens=skip)
    deltas, pos = [], 0
    for size in sizes:
        if pos >= len(ids):
            break
        deltas.append(dec.push(ids[pos:pos + size]))
        pos += size
    deltas.append(dec.flush())
    assert dec.text == "".join(deltas)
    return deltas, dec.text


def test_incremental_decoder_multibyte(tok, texts):
    samples = MULTIBYTE + [t for t in texts if re.search(r"[^\x00-\x7f]", t)][:25]
    rng = random.Random(0)
    held_back = 0
    for text in samples:
        ids = tok.encode(text)
        full = tok.decode(ids)
        deltas, joined = stream(tok, ids, [1] * len(ids))
        assert joined == full
        assert not any("\ufffd" in d for d in deltas), text[:40]  # never a half character
        held_back += sum(1 for d in deltas[:-1] if d == "")
        _, joined = stream(tok, ids, iter(lambda: rng.randint(1, 7), None))
        assert joined == full
    assert held_back > 20  # emoji / CJK bytes really were split across tokens and held back


def test_incremental_decoder_specials_and_flush(tok):
    ids = tok.encode("<|im_start|>assistant\n日本語 🙂<|im_end|>")
    for skip in (False, True):
        _, joined = stream(tok, ids, [1] * len(ids), skip=skip)
        assert joined == tok.decode(ids, skip_special_tokens=skip)
    emoji = tok.encode("🙂")
    assert len(emoji) > 1
    dec = IncrementalDecoder(tok)
    assert dec.push(emoji[:-1]) == ""  # incomplete character: held back
    assert dec.flush() == tok.decode(emoji[:-1]) and dec.text.endswith("\ufffd")


def test_same_vocab(metadata, tok):
    assert tok.same_vocab(Tokenizer.from_gguf_metadata(metadata)) is None
    tokens = list(metadata["tokenizer.ggml.tokens"])
    tokens[3] = "<repo>"  # a control token: no merge refers to it
    changed = Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.tokens": tokens})
    assert tok.same_vocab(changed) == "token 3: '<repo_name>' vs '<repo>'"
    n = 32000
    kept = set(tokens[:n])
    truncated = Tokenizer.from_gguf_metadata({
        **metadata, "tokenizer.ggml.tokens": metadata["tokenizer.ggml.tokens"][:n],
        "tokenizer.ggml.token_type": metadata["tokenizer.ggml.token_type"][:n],
        "tokenizer.ggml.merges": [m for m in metadata["tokenizer.ggml.merges"]
                                  if {*m.split(" "), m.replace(" ", "")} <= kept]})
    assert tok.same_vocab(truncated) == "vocab size 49152 vs 32000"
    types = list(metadata["tokenizer.ggml.token_type"])
    types[5] = 1  # <file_sep> no longer a control token
    assert "token 5" in tok.same_vocab(Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.token_type": types}))


def test_eot_and_eom_are_eos(metadata):
    tok = Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.eot_token_id": 0,
                                        "tokenizer.ggml.eom_token_id": 5})
    assert tok.eos_token_ids == {0, 2, 5}


def test_user_defined_tokens_are_added_not_special(metadata):
    # GGUF stores user-defined tokens as raw text (convert_hf_to_gguf writes real spaces), matched anywhere in text
    tokens, types = list(metadata["tokenizer.ggml.tokens"]), list(metadata["tokenizer.ggml.token_type"])
    tokens[15], tokens[16] = "<tool_call>", "hello world"  # two control tokens no merge refers to
    types[15] = types[16] = 4
    tok = Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.tokens": tokens,
                                        "tokenizer.ggml.token_type": types})
    ids = tok.encode("call<tool_call>{say hello world}")
    assert 15 in ids and 16 in ids
    assert tok.decode(ids, skip_special_tokens=True) == "call<tool_call>{say hello world}"
    assert tok.decode([1, 15, 16, 2], skip_special_tokens=True) == "<tool_call>hello world"


def test_llama_bpe_ignores_merges_for_whole_words():
    # llama.cpp sets ignore_merges for llama-bpe (as Llama 3's tokenizer.json does): a pre-token that is
    # itself in the vocabulary is one token even when the merges would not build it
    tiny = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "c", "bc", "abc"],
            "tokenizer.ggml.token_type": [1] * 5, "tokenizer.ggml.merges": ["b c"]}
    assert Tokenizer.from_gguf_metadata({**tiny, "tokenizer.ggml.pre": "llama-bpe"}).encode("abc") == [4]
    assert Tokenizer.from_gguf_metadata({**tiny, "tokenizer.ggml.pre": "smollm"}).encode("abc") == [0, 3]


def test_llama_bpe_pre_tokenizer(metadata, texts):
    without_flag = {k: v for k, v in metadata.items() if k != "tokenizer.ggml.add_bos_token"}
    llama3 = Tokenizer.from_gguf_metadata({**without_flag, "tokenizer.ggml.pre": "llama-bpe"})
    pieces = [p for p, _ in llama3._tok.pre_tokenizer.pre_tokenize_str("x 1234567 I'LL go\n\n  ok")]
    assert pieces == ["x", "Ġ", "123", "456", "7", "ĠI", "'LL", "Ġgo", "ĊĊ", "Ġ", "Ġok"]
    assert llama3.add_bos and llama3.encode("Hi")[0] == 1  # llama.cpp: llama-bpe adds BOS by default
    no_bos = Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.pre": "llama-bpe",
                                           "tokenizer.ggml.add_bos_token": False})
    assert not no_bos.add_bos and no_bos.encode("Hi") == llama3.encode("Hi")[1:]
    assert llama3.encode_chat([{"role": "user", "content": "Hi"}]).count(1) == 3  # no BOS added to the template
    from transformers.convert_slow_tokenizer import TikTokenConverter

    pattern = inspect.signature(TikTokenConverter.__init__).parameters["pattern"].default  # Llama 3's split
    reference = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    for text in texts[:80]:
        assert llama3._tok.pre_tokenizer.pre_tokenize_str(text) == reference.pre_tokenize_str(text)


def test_qwen2_pre_tokenizer_matches_transformers(metadata, texts):
    from transformers.integrations.ggml import GGUFQwen2Converter

    qwen = Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.pre": "qwen2"})
    reference = GGUFQwen2Converter({"tokens": list(metadata["tokenizer.ggml.tokens"]),
                                    "merges": list(metadata["tokenizer.ggml.merges"])}).converted()
    samples = texts[:100] + ["e\u0301 cafe\u0301 123 ﬁ"]  # NFC composes e + U+0301
    ours = [qwen.encode(t) for t in samples]
    assert first_mismatch(ours, [reference.encode(t).ids for t in samples], samples) is None
    assert qwen.encode("\u00e9") == qwen.encode("e\u0301")


def test_unknown_pre_tokenizer_is_rejected(metadata):
    with pytest.raises(ValueError, match=r"pre-tokenizer 'mystery-bpe'.*supported:.*smollm"):
        Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.pre": "mystery-bpe"}, source="x.gguf")


def test_sentencepiece_gguf_is_rejected(metadata):
    with pytest.raises(ValueError, match=r"'llama'.*Hugging Face directory \(tokenizer\.json\)"):
        Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.model": "llama"}, source="x.gguf")
    with pytest.raises(ValueError, match="'bert'"):
        Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.model": "bert"})
