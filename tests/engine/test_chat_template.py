"""Chat templates: engine.tokenizer renders and tokenizes exactly like transformers' apply_chat_template.

The reference is transformers' tokenizer for the SmolLM2 GGUF, with SmolLM2's real pre-tokenizer
(digits split first; transformers' GGUF conversion leaves it out, see test_tokenizer.py).
"""

from __future__ import annotations

import copy
import json

import jinja2
import pytest
from tokenizers import pre_tokenizers

from bench.datasets import sharegpt
from engine.assets import default_model_path
from engine.models.weights.gguf_loader import open_gguf
from engine.tokenizer import Tokenizer

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
USER = {"role": "user", "content": "What is 2 + 2?\n\n1. explain\n2. answer"}
ASSISTANT = {"role": "assistant", "content": "4. Because 2 + 2 = 4 🙂"}
CONVERSATIONS = {
    "user": [USER],
    "system+user": [SYSTEM, USER],
    "multi-turn": [USER, ASSISTANT, {"role": "user", "content": "And 3 + 3? 数学"}],
    "ends-with-assistant": [SYSTEM, USER, ASSISTANT],
}
# exercises what transformers provides: bos/eos variables, tojson, raise_exception, loop controls, {% generation %}
CUSTOM_TEMPLATE = """{{ bos_token }}
{% for m in messages %}
    {% if m['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('bad role: ' + m['role']) }}
    {% endif %}
    {% if m['role'] == 'system' %}{% continue %}{% endif %}
[{{ m['role'] }}] {{ m['content'] | tojson }}
    {% if m['role'] == 'assistant' %}
{% generation %}{{ m['content'] }}{% endgeneration %}{{ eos_token }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}[assistant]{% endif %}"""


def sharegpt_conversations(count: int = 6) -> list[list[dict[str, str]]]:
    out = []
    for conv in sharegpt(split="train", limit=200):
        turns = [{"role": role, "content": text} for role, text in conv.turns[:3]]
        if len(turns) == 3 and turns[0]["role"] == "user":
            out.append(turns)
        if len(out) == count:
            break
    return out


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(open_gguf(default_model_path(quiet=True)).metadata)


@pytest.fixture(scope="module")
def ref():
    transformers = pytest.importorskip("transformers")
    path = default_model_path(quiet=True)
    loaded = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    loaded.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    return loaded


@pytest.fixture(scope="module")
def hf_dir(ref, tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2_hf")
    ref.save_pretrained(out)
    return out


def all_conversations() -> list[tuple[str, list[dict[str, str]]]]:
    return list(CONVERSATIONS.items()) + [(f"sharegpt-{i}", c) for i, c in enumerate(sharegpt_conversations())]


def ref_ids(ref, messages, add_generation_prompt: bool) -> list[int]:
    out = ref.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(out["input_ids"] if hasattr(out, "keys") else out)  # transformers 5 returns a BatchEncoding


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_matches_transformers(tok, ref, add_generation_prompt):
    for name, messages in all_conversations():
        ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        theirs = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert ours == theirs, name
        assert ours.endswith("<|im_start|>assistant\n") == add_generation_prompt, name


def test_render_smollm2_shape(tok):
    text = tok.apply_chat_template([USER])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\n" + USER["content"] + "<|im_end|>\n<|im_start|>assistant\n")
    assert tok.apply_chat_template([SYSTEM, USER], add_generation_prompt=False).startswith(
        "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n")


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_encode_chat_matches_transformers(tok, ref, add_generation_prompt):
    for name, messages in all_conversations():
        ours = tok.encode_chat(messages, add_generation_prompt=add_generation_prompt)
        assert ours == ref_ids(ref, messages, add_generation_prompt), name
        assert ours[0] == 1 and ours.count(2) == len(messages) + (messages[0]["role"] != "system"), name


def test_hf_dir_renders_identically(tok, ref, hf_dir):
    hf = Tokenizer.from_hf_dir(hf_dir)
    assert (hf_dir / "chat_template.jinja").is_file()  # where transformers 5 saves it
    for name, messages in all_conversations():
        for gen in (True, False):
            assert hf.apply_chat_template(messages, gen) == tok.apply_chat_template(messages, gen), name
            assert hf.encode_chat(messages, gen) == ref_ids(ref, messages, gen), name


def test_template_in_tokenizer_config(tok, hf_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
    config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = tok.chat_template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_hf_dir(tmp_path).apply_chat_template([USER]) == tok.apply_chat_template([USER])
    config["chat_template"] = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_hf_dir(tmp_path).apply_chat_template([USER]) == "DEFAULT"
    (tmp_path / "chat_template.jinja").write_text("FILE{{ messages[0]['content'] }}")  # the file wins
    assert Tokenizer.from_hf_dir(tmp_path).apply_chat_template([USER]) == "FILE" + USER["content"]


def test_no_template_is_an_error(hf_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
    plain = Tokenizer.from_hf_dir(tmp_path)
    assert plain.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        plain.apply_chat_template([USER])
    with pytest.raises(ValueError, match="no chat template"):
        plain.encode_chat([USER])


def test_custom_template_features_match_transformers(hf_dir, tmp_path):
    """bos/eos variables, tojson, raise_exception: compared with transformers on an HF directory."""
    transformers = pytest.importorskip("transformers")
    (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
    config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    config.update(eos_token="<|im_end|>", bos_token="<|im_start|>", chat_template=CUSTOM_TEMPLATE)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, theirs = Tokenizer.from_hf_dir(tmp_path), transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for name, messages in CONVERSATIONS.items():
        for gen in (True, False):
            rendered = ours.apply_chat_template(copy.deepcopy(messages), gen)
            assert rendered == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen), name
    rendered = ours.apply_chat_template(CONVERSATIONS["ends-with-assistant"], False)
    assert rendered.startswith("<|im_start|>\n[user] ") and rendered.endswith("\n4. Because 2 + 2 = 4 🙂<|im_end|>\n")
    assert '"4. Because 2 + 2 = 4 🙂"' in rendered  # tojson keeps non-ASCII (ensure_ascii=False)
    bad = [{"role": "tool", "content": "x"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="bad role: tool"):
        ours.apply_chat_template(bad)
    with pytest.raises(jinja2.exceptions.TemplateError, match="bad role: tool"):
        theirs.apply_chat_template(bad, tokenize=False)
