"""Client requests: validation of GenerateRequest (errors name the field) and per-request state."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from dataclasses import dataclass, field

from engine.config import SamplingParams, check_k
from engine.drafters.base import FeatureQueue
from engine.request import FinishReason
from engine.tokenizer import Tokenizer
from gateway.settings import GatewaySettings
from protos.tandem.v1 import gateway_pb2
from rpc import convert, tensors

_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Event:
    """One message for a client stream (``error`` ends it with that gRPC code)."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    error: tuple[object, str] | None = None  # (grpc.StatusCode, message)


@dataclass(eq=False)
class GatewayRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams                 # seed resolved
    max_context: int
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    rounds: int = 0
    accepted: int = 0
    drafted: int = 0
    arrival: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    # drafter bookkeeping (split mode): how much of `tokens` the drafter holds as history,
    # and drafts for the next round already made by an early draft that came true
    drafter_len: int = 0
    ready_drafts: list[int] | None = None
    ready_probs: object = None
    features: FeatureQueue = field(default_factory=FeatureQueue)  # target features the drafter still needs
    span: object = None                    # the request's trace span
    # the gateway's own name for it, unique across gateway replicas (a client's request_id is only a label):
    # what pins it to a verifier; on a co-located Serve stream it is the stream's slot
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    slot: int = -1
    deadline: float | None = None          # perf_counter time past which it may not wait any longer (the client's)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def room(self) -> int:
        """Tokens this request may still commit."""
        return max(0, min(self.params.max_tokens - len(self.output_ids),
                          self.max_context - len(self.prompt_ids) - len(self.output_ids)))

    def usage(self) -> gateway_pb2.Usage:
        tau = (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0
        return gateway_pb2.Usage(prompt_tokens=len(self.prompt_ids), completion_tokens=len(self.output_ids),
                                 rounds=self.rounds, accepted_tokens=self.accepted, draft_tokens=self.drafted,
                                 acceptance_length=tau)


class RequestBuilder:
    """Turns a GenerateRequest into a GatewayRequest, or a ValueError naming the bad field."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, max_context: int, settings: GatewaySettings) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab_size
        self.max_context = max_context
        self.s = settings

    def _prompt(self, req: gateway_pb2.GenerateRequest) -> list[int]:
        kind = req.WhichOneof("prompt")
        limit = self.s.max_prompt_bytes
        if kind is None:
            raise ValueError("prompt: one of text, messages or token_ids is required")
        if kind == "text":
            if len(req.text.encode()) > limit:
                raise ValueError(f"prompt.text: {len(req.text.encode())} bytes exceed the limit of {limit}")
            if not req.text:
                raise ValueError("prompt.text: must not be empty")
            return self.tokenizer.encode(req.text)
        if kind == "messages":
            msgs = req.messages.messages
            size = sum(len(m.content.encode()) + len(m.role.encode()) for m in msgs)
            if size > limit:
                raise ValueError(f"prompt.messages: {size} bytes exceed the limit of {limit}")
            if not msgs:
                raise ValueError("prompt.messages: must not be empty")
            for i, m in enumerate(msgs):
                if m.role not in _ROLES:
                    raise ValueError(f"prompt.messages[{i}].role: {m.role!r} is not one of {', '.join(_ROLES)}")
            return self.tokenizer.encode_chat([{"role": m.role, "content": m.content} for m in msgs])
        if len(req.token_ids.data) > limit:
            raise ValueError(f"prompt.token_ids: {len(req.token_ids.data)} bytes exceed the limit of {limit}")
        ids = tensors.token_ids(req.token_ids, "prompt.token_ids")
        if not ids:
            raise ValueError("prompt.token_ids: must not be empty")
        bad = next((t for t in ids if not 0 <= t < self.vocab), None)
        if bad is not None:
            raise ValueError(f"prompt.token_ids: token id {bad} is outside the vocabulary [0, {self.vocab})")
        return ids

    def build(self, req: gateway_pb2.GenerateRequest) -> GatewayRequest:
        ids = self._prompt(req)
        if len(ids) >= self.max_context:
            raise ValueError(f"prompt: {len(ids)} tokens do not fit the context of {self.max_context}")
        params = convert.sampling_from_pb(req.sampling)
        if params.max_tokens > self.s.max_tokens_limit:
            raise ValueError(f"sampling.max_tokens: {params.max_tokens} exceeds the limit of {self.s.max_tokens_limit}")
        if params.k is not None:
            check_k(params.k, self.s.max_k, "sampling.k")
        if len(params.stop) > self.s.max_stop_strings:
            raise ValueError(f"sampling.stop: {len(params.stop)} stop strings exceed the limit of "
                             f"{self.s.max_stop_strings}")
        longest = max((len(x) for x in params.stop), default=0)
        if longest > self.s.max_stop_chars:
            raise ValueError(f"sampling.stop: a stop string of {longest} characters exceeds the limit of "
                             f"{self.s.max_stop_chars}")
        if params.seed is None:
            params = dataclasses.replace(params, seed=random.getrandbits(63))
        return GatewayRequest(request_id=req.request_id or uuid.uuid4().hex, prompt_ids=ids, params=params,
                              max_context=self.max_context)
