from protos.tandem.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillItem(_message.Message):
    __slots__ = ("request_id", "prompt", "output", "sampling")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: _common_pb2.Tensor
    output: _common_pb2.Tensor
    sampling: _common_pb2.SamplingParams
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., output: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("items", "feature_layers", "feature_window")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_WINDOW_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PrefillItem]
    feature_layers: _containers.RepeatedScalarFieldContainer[int]
    feature_window: int
    def __init__(self, items: _Optional[_Iterable[_Union[PrefillItem, _Mapping]]] = ..., feature_layers: _Optional[_Iterable[int]] = ..., feature_window: _Optional[int] = ...) -> None: ...

class VerifyItem(_message.Message):
    __slots__ = ("request_id", "draft_tokens", "draft_probs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    draft_tokens: _common_pb2.Tensor
    draft_probs: _common_pb2.DraftDistribution
    def __init__(self, request_id: _Optional[str] = ..., draft_tokens: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., draft_probs: _Optional[_Union[_common_pb2.DraftDistribution, _Mapping]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("items", "feature_layers", "feature_window")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_WINDOW_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[VerifyItem]
    feature_layers: _containers.RepeatedScalarFieldContainer[int]
    feature_window: int
    def __init__(self, items: _Optional[_Iterable[_Union[VerifyItem, _Mapping]]] = ..., feature_layers: _Optional[_Iterable[int]] = ..., feature_window: _Optional[int] = ...) -> None: ...

class StepItem(_message.Message):
    __slots__ = ("request_id", "k")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    k: int
    def __init__(self, request_id: _Optional[str] = ..., k: _Optional[int] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[StepItem]
    def __init__(self, items: _Optional[_Iterable[_Union[StepItem, _Mapping]]] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("request_id", "error", "error_code", "accepted", "drafted", "committed", "text", "finish_reason", "features", "features_start", "rounds")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURES_START_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    error: str
    error_code: int
    accepted: int
    drafted: int
    committed: _common_pb2.Tensor
    text: str
    finish_reason: _common_pb2.FinishReason
    features: _common_pb2.Tensor
    features_start: int
    rounds: int
    def __init__(self, request_id: _Optional[str] = ..., error: _Optional[str] = ..., error_code: _Optional[int] = ..., accepted: _Optional[int] = ..., drafted: _Optional[int] = ..., committed: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., features: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., features_start: _Optional[int] = ..., rounds: _Optional[int] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("verdicts",)
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    verdicts: _containers.RepeatedCompositeFieldContainer[Verdict]
    def __init__(self, verdicts: _Optional[_Iterable[_Union[Verdict, _Mapping]]] = ...) -> None: ...

class ServeControl(_message.Message):
    __slots__ = ("admit", "cancel")
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    admit: _containers.RepeatedCompositeFieldContainer[ServeAdmit]
    cancel: _common_pb2.Tensor
    def __init__(self, admit: _Optional[_Iterable[_Union[ServeAdmit, _Mapping]]] = ..., cancel: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class ServeAdmit(_message.Message):
    __slots__ = ("slot", "prompt", "output", "sampling")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    slot: int
    prompt: _common_pb2.Tensor
    output: _common_pb2.Tensor
    sampling: _common_pb2.SamplingParams
    def __init__(self, slot: _Optional[int] = ..., prompt: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., output: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class ServeUpdate(_message.Message):
    __slots__ = ("rounds", "errors")
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    rounds: _containers.RepeatedCompositeFieldContainer[RoundReport]
    errors: _containers.RepeatedCompositeFieldContainer[SlotError]
    def __init__(self, rounds: _Optional[_Iterable[_Union[RoundReport, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[SlotError, _Mapping]]] = ...) -> None: ...

class RoundReport(_message.Message):
    __slots__ = ("slots", "counts", "tokens", "accepted", "drafted", "k", "finish", "text", "text_offsets", "start_unix_nano", "duration_ns", "rounds")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    slots: _common_pb2.Tensor
    counts: _common_pb2.Tensor
    tokens: _common_pb2.Tensor
    accepted: _common_pb2.Tensor
    drafted: _common_pb2.Tensor
    k: _common_pb2.Tensor
    finish: _common_pb2.Tensor
    text: bytes
    text_offsets: _common_pb2.Tensor
    start_unix_nano: int
    duration_ns: int
    rounds: _common_pb2.Tensor
    def __init__(self, slots: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., counts: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., tokens: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., accepted: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., drafted: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., k: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., finish: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., text: _Optional[bytes] = ..., text_offsets: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., start_unix_nano: _Optional[int] = ..., duration_ns: _Optional[int] = ..., rounds: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class SlotError(_message.Message):
    __slots__ = ("slot", "code", "message")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    slot: int
    code: int
    message: str
    def __init__(self, slot: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...
