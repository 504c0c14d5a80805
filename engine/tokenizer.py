"""Tokenizer for a GGUF file or a Hugging Face directory, with chat templates and streaming decode.

A GGUF byte-level BPE vocabulary (``tokenizer.ggml.model == "gpt2"``) is rebuilt with the
``tokenizers`` library; the pre-tokenizer follows llama.cpp's meaning of ``tokenizer.ggml.pre``
(expressed as the ``tokenizer.json`` pieces the original Hugging Face tokenizers use). A Hugging
Face directory is read from its ``tokenizer.json``. Chat templates render the way ``transformers``
renders them (same Jinja environment, filters and variables).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _RustTokenizer

# The GPT-2 split ('s|'t|...| ?\p{L}+| ?\p{N}+|...) is built into pre_tokenizers.ByteLevel(use_regex=True).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> pre-tokenizer family (llama.cpp groups these names the same way)
_PRE_FAMILY = {
    "default": "gpt2", "gpt2": "gpt2", "gpt-2": "gpt2",
    "smollm": "digits", "starcoder": "digits", "refact": "digits", "command-r": "digits", "codeshell": "digits",
    "llama-bpe": "llama3", "llama3": "llama3", "llama-v3": "llama3",
    "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2",
}
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4
# transformers' named special tokens, passed to chat templates, and their GGUF id keys
_SPECIAL_NAMES = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                  "sep_token": "seperator_token_id", "pad_token": "padding_token_id",
                  "cls_token": "cls_token_id", "mask_token": "mask_token_id"}


def _byte_level_pre_tokenizer(family: str) -> tuple[Any, Any]:
    """(normalizer, pre-tokenizer) for a byte-level BPE vocabulary of the given family."""
    if family == "gpt2":
        return None, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if family == "digits":
        return None, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    pattern = _LLAMA3_SPLIT if family == "llama3" else _QWEN2_SPLIT
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return (normalizers.NFC() if family == "qwen2" else None), pre


def _bos_eos_processor(bos: tuple[str, int] | None, eos: tuple[str, int] | None) -> processors.TemplateProcessing:
    """``[BOS] $A [EOS]`` with either end optional (what ``add_bos_token`` / ``add_eos_token`` mean)."""
    head = [bos[0]] if bos else []
    tail = [eos[0]] if eos else []
    return processors.TemplateProcessing(
        single=" ".join(head + ["$A"] + tail), pair=" ".join(head + ["$A"] + tail + head + ["$B:1"] + tail),
        special_tokens=[t for t in (bos, eos) if t])


def _token_content(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


class _GenerationTag(jinja2.ext.Extension):
    """Accept ``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask tag) as a plain block."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


@functools.lru_cache(maxsize=16)
def _compile_template(source: str) -> jinja2.Template:
    """Compile a chat template in the environment transformers uses (sandboxed, trim/lstrip blocks)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template.

    ``vocab_size`` counts every id (added tokens included); ``eos_token_ids`` are all ids that end
    generation; ``add_bos`` tells whether ``encode`` prepends BOS to raw text; ``special_tokens``
    holds the named special tokens (``bos_token``, ``eos_token``, ...) that templates may use.
    """

    def __init__(self, backend: _RustTokenizer, *, special_tokens: dict[str, str | None], eos_token_ids: set[int],
                 chat_template: str | None, source: str) -> None:
        self._tok = backend
        self.source = source
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        bos = self.special_tokens.get("bos_token")
        self.bos_token_id: int | None = backend.token_to_id(bos) if bos is not None else None
        self.eos_token_ids: frozenset[int] = frozenset(eos_token_ids)
        self.chat_template = chat_template
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.add_bos: bool = self.bos_token_id is not None and backend.encode("").ids[:1] == [self.bos_token_id]

    @classmethod
    def from_gguf_metadata(cls, metadata: dict[str, Any], source: str = "gguf") -> "Tokenizer":
        """Build from the ``tokenizer.ggml.*`` keys of a GGUF file (byte-level BPE vocabularies only)."""
        model = metadata.get("tokenizer.ggml.model")
        if model == "llama":
            raise ValueError(f"{source}: the GGUF tokenizer is SentencePiece ('llama'), which is not rebuilt from "
                             "GGUF metadata; load the model from its Hugging Face directory (tokenizer.json) instead")
        if model != "gpt2":
            raise ValueError(f"{source}: GGUF tokenizer model {model!r} is not supported (supported: 'gpt2')")
        pre = metadata.get("tokenizer.ggml.pre", "default")
        if pre not in _PRE_FAMILY:
            raise ValueError(f"{source}: GGUF pre-tokenizer {pre!r} is not supported "
                             f"(supported: {', '.join(sorted(_PRE_FAMILY))})")
        family = _PRE_FAMILY[pre]
        tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
        backend = _RustTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges,
                                            ignore_merges=family == "llama3"))
        normalizer, backend.pre_tokenizer = _byte_level_pre_tokenizer(family)
        if normalizer is not None:
            backend.normalizer = normalizer
        backend.decoder = decoders.ByteLevel()
        types = metadata.get("tokenizer.ggml.token_type", [])
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                    for i, t in enumerate(types) if t == _TOKEN_CONTROL])
        backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                            for i, t in enumerate(types) if t == _TOKEN_USER_DEFINED])

        def token(key: str) -> str | None:
            i = metadata.get(f"tokenizer.ggml.{key}")
            return tokens[i] if i is not None and 0 <= i < len(tokens) else None

        special = {name: token(key) for name, key in _SPECIAL_NAMES.items()}
        bos_id, eos_id = metadata.get("tokenizer.ggml.bos_token_id"), metadata.get("tokenizer.ggml.eos_token_id")
        add_bos = metadata.get("tokenizer.ggml.add_bos_token", family == "llama3")  # llama.cpp's default
        add_eos = metadata.get("tokenizer.ggml.add_eos_token", False)
        bos_pair = (tokens[bos_id], bos_id) if add_bos and bos_id is not None else None
        eos_pair = (tokens[eos_id], eos_id) if add_eos and eos_id is not None else None
        if bos_pair or eos_pair:
            backend.post_processor = _bos_eos_processor(bos_pair, eos_pair)
        eos = {metadata[f"tokenizer.ggml.{k}"] for k in ("eos_token_id", "eot_token_id", "eom_token_id")
               if metadata.get(f"tokenizer.ggml.{k}") is not None}
        return cls(backend, special_tokens=special, eos_token_ids=eos,
                   chat_template=metadata.get("tokenizer.chat_template"), source=source)

    @classmethod
    def from_hf_dir(cls, directory: str | Path) -> "Tokenizer":
        """Load ``tokenizer.json``, plus ``tokenizer_config.json``, ``chat_template.jinja`` and
        ``generation_config.json`` where present."""
        directory = Path(directory)
        if not (directory / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{directory}: no tokenizer.json (only fast tokenizers are supported)")
        try:
            backend = _RustTokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:  # the Rust library raises a bare Exception
            raise ValueError(f"{directory / 'tokenizer.json'}: not a valid tokenizer ({exc})") from exc

        def read_json(name: str) -> dict[str, Any]:
            path = directory / name
            return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

        config = read_json("tokenizer_config.json")
        legacy_map = read_json("special_tokens_map.json")
        special = {name: _token_content(config.get(name, legacy_map.get(name))) for name in _SPECIAL_NAMES}
        if "add_bos_token" in config or "add_eos_token" in config:  # transformers then rebuilds the post-processor
            def pair(name: str, flag: str) -> tuple[str, int] | None:
                tok = special[name]
                return (tok, backend.token_to_id(tok)) if config.get(flag) and tok is not None else None
            backend.post_processor = _bos_eos_processor(pair("bos_token", "add_bos_token"),
                                                        pair("eos_token", "add_eos_token"))
        eos_id = backend.token_to_id(special["eos_token"]) if special["eos_token"] is not None else None
        eos = {eos_id} if eos_id is not None else set()
        generation_eos = read_json("generation_config.json").get("eos_token_id")
        eos.update(generation_eos if isinstance(generation_eos, list) else
                   [generation_eos] if generation_eos is not None else [])
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": ..., "template": ...}]: the "default" one
            template = {t["name"]: t["template"] for t in template}.get("default")
        if (directory / "chat_template.jinja").is_file():
            template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
        return cls(backend, special_tokens=special, eos_token_ids=eos, chat_template=template, source=str(directory))

    def save_hf(self, directory: str | Path) -> None:
        """Write tokenizer.json, tokenizer_config.json and generation_config.json (what ``from_hf_dir``
        and transformers read), so a draft model exported next to it is a complete checkpoint."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(directory / "tokenizer.json"))
        config: dict[str, Any] = {**self.special_tokens, "tokenizer_class": "PreTrainedTokenizerFast"}
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        gen = {"eos_token_id": sorted(self.eos_token_ids)}
        if self.bos_token_id is not None:
            gen["bos_token_id"] = self.bos_token_id
        (directory / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens written in the text are recognised as such."""
        # encode_batch lets go of the GIL while it works (encode holds it): a long prompt tokenized on a thread
        # does not stop the event loop beside it
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str:
        token = self._tok.id_to_token(i)
        if token is None:
            raise IndexError(f"token id {i} is out of range for a vocabulary of {self.vocab_size}")
        return token

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages``, rendered like transformers' ``apply_chat_template(tokenize=False)``."""
        if self.chat_template is None:
            raise ValueError(f"{self.source}: the model has no chat template; send a raw prompt instead")
        template = _compile_template(self.chat_template)
        return template.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=add_generation_prompt, **self.special_tokens)

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Ids of the rendered template; no BOS is added (the template writes its own special tokens)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt), add_special_tokens=False)

    @property
    def _bos_prefix(self) -> int | None:
        return self.bos_token_id if self.add_bos else None

    def _special_ids(self) -> frozenset[int]:
        return frozenset(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)

    def same_vocab(self, other: "Tokenizer") -> str | None:
        """None if ``other`` maps token strings to the same ids (same specials, same BOS prefix); else why not."""
        if self.vocab_size != other.vocab_size:
            return f"vocab size {self.vocab_size} vs {other.vocab_size}"
        mine, theirs = self._tok.get_vocab(with_added_tokens=True), other._tok.get_vocab(with_added_tokens=True)
        if mine != theirs:
            by_id = {i: t for t, i in mine.items()}
            other_by_id = {i: t for t, i in theirs.items()}
            i = min(i for i in by_id.keys() | other_by_id.keys() if by_id.get(i) != other_by_id.get(i))
            return f"token {i}: {by_id.get(i)!r} vs {other_by_id.get(i)!r}"
        if self._special_ids() != other._special_ids():
            i = min(self._special_ids() ^ other._special_ids())
            return f"token {i} ({self.id_to_token(i)!r}) is special in only one of the tokenizers"
        if self._bos_prefix != other._bos_prefix:
            return f"BOS prepended to raw text: {self._bos_prefix} vs {other._bos_prefix}"
        return None


class IncrementalDecoder:
    """Streaming detokenization of one sequence: text deltas that never end in a partial UTF-8 character.

    Each step decodes a short window of ids starting at the last clean boundary, so the cost per
    push does not grow with the length of the sequence.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.text = ""
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window (a clean boundary)
        self._read = 0  # ids before this have been emitted

    def _window(self, end: int | None = None) -> str:
        return self.tokenizer.decode(self._ids[self._prefix:end], skip_special_tokens=self.skip_special_tokens)

    def push(self, ids: Sequence[int]) -> str:
        """Add ids; return the newly completed text (possibly empty)."""
        self._ids.extend(ids)
        emitted = self._window(self._read)
        current = self._window()
        if len(current) <= len(emitted) or current.endswith("\ufffd"):
            return ""
        delta = current[len(emitted):]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Emit whatever is held back (an incomplete character decodes as U+FFFD, like ``decode``)."""
        delta = self._window()[len(self._window(self._read)):]
        self._prefix = self._read = len(self._ids)
        self.text += delta
        return delta
