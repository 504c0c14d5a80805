"""A request's state across rounds, and the rules that end it (EOS, max tokens, stop strings, context)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from engine.config import SamplingParams
from engine.drafters.base import FeatureQueue
from engine.tokenizer import IncrementalDecoder, Tokenizer


class FinishReason(str, enum.Enum):
    STOP = "stop"      # EOS token or a stop string
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"    # cancelled by the caller


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    rounds: int
    accepted: int      # draft tokens accepted over all rounds
    drafted: int       # draft tokens proposed over all rounds
    round_accepted: int = 0  # of this step's round
    round_drafted: int = 0
    round_count: int = 1  # rounds this step's tokens took (a replay of several rounds: --spec-rounds)
    # split mode: the target's features of the positions this step verified, for a feature-fed
    # drafter in another process ([n, F], positions features_start .. features_start + n - 1)
    features: torch.Tensor | None = None
    features_start: int = 0

    @property
    def acceptance_length(self) -> float:
        """Mean tokens committed per round (accepted + 1)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams          # seed resolved
    max_context: int
    eos_token_ids: frozenset[int]
    decoder: IncrementalDecoder
    token_ids: list[int] = field(default_factory=list)
    text: str = ""                  # text emitted so far
    finish_reason: FinishReason | None = None
    rounds: int = 0
    accepted: int = 0
    drafted: int = 0
    draws: int = 0                  # rounds of coins drawn from the target's streams (engine/sampling/coins.py)
    features: FeatureQueue = field(default_factory=FeatureQueue)  # target features not yet handed to a drafter

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_ids)

    @classmethod
    def create(cls, request_id: str, prompt_ids: list[int], params: SamplingParams, tokenizer: Tokenizer,
               max_context: int) -> "Request":
        return cls(request_id, list(prompt_ids), params, max_context, tokenizer.eos_token_ids,
                   IncrementalDecoder(tokenizer, skip_special_tokens=True))

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def room(self) -> int:
        """How many more tokens this request may commit."""
        return max(0, min(self.params.max_tokens - self.num_output, self.max_context - len(self.token_ids)))

    def resume(self, output_ids: list[int]) -> None:
        """Take over output committed elsewhere (already delivered: nothing is emitted again)."""
        self.token_ids.extend(output_ids)
        for tok in output_ids:  # token by token, as streamed: a split character ends on a clean boundary
            self.decoder.push([tok])
        self.text = self.decoder.text

    def commit(self, tokens: list[int]) -> tuple[list[int], str]:
        """Append a round's committed tokens, applying the stop rules -> (tokens kept, text delta). Without stop
        strings the kept tokens are detokenized at once (one decode a round); with them token by token, since a
        stop string ends the output where it starts."""
        n, reason = self._ends_at(tokens)
        kept = list(tokens[:n])
        stops, stop_at = self.params.stop, None
        hold = max((len(s) for s in stops), default=1) - 1  # a stop string may still be forming
        if not stops:
            self.decoder.push(kept)
        else:
            for j, tok in enumerate(kept):
                before = len(self.decoder.text)
                self.decoder.push([tok])
                window = self.decoder.text[max(0, before - hold):]
                hits = [i for i in (window.find(s) for s in stops) if i >= 0]
                if hits:
                    stop_at, reason, kept = max(0, before - hold) + min(hits), FinishReason.STOP, kept[: j + 1]
                    break
        self.token_ids.extend(kept)
        self.finish_reason = reason
        if stop_at is not None:
            visible = self.decoder.text[:stop_at]
        elif self.finished:
            self.decoder.flush()
            visible = self.decoder.text
        else:
            visible = self.decoder.text[: len(self.decoder.text) - hold] if hold else self.decoder.text
        delta = visible[len(self.text):] if len(visible) > len(self.text) else ""
        self.text += delta
        return kept, delta

    def _ends_at(self, tokens: list[int]) -> tuple[int, FinishReason | None]:
        """How many of a round's tokens the token rules keep (EOS, max tokens, the context) and how they end it."""
        room, eos = self.room(), () if self.params.ignore_eos else self.eos_token_ids
        for i, tok in enumerate(tokens):
            if tok in eos:
                return i + 1, FinishReason.STOP
            if i + 1 >= room:
                return i + 1, FinishReason.LENGTH
        return len(tokens), None

    def output(self, new_tokens: list[int], delta: str, round_accepted: int = 0, round_drafted: int = 0,
               round_count: int = 1) -> RequestOutput:
        return RequestOutput(self.request_id, new_tokens, delta, self.finished, self.finish_reason,
                             len(self.prompt_ids), self.num_output, self.rounds, self.accepted, self.drafted,
                             round_accepted, round_drafted, round_count)
