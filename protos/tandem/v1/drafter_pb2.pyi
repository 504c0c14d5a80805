from protos.tandem.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DraftStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRAFT_STATUS_OK: _ClassVar[DraftStatus]
    DRAFT_STATUS_RESYNC: _ClassVar[DraftStatus]
    DRAFT_STATUS_INVALID: _ClassVar[DraftStatus]
DRAFT_STATUS_OK: DraftStatus
DRAFT_STATUS_RESYNC: DraftStatus
DRAFT_STATUS_INVALID: DraftStatus

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrafterInfo(_message.Message):
    __slots__ = ("name", "deterministic", "feature_layers", "feature_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    deterministic: bool
    feature_layers: _containers.RepeatedScalarFieldContainer[int]
    feature_size: int
    def __init__(self, name: _Optional[str] = ..., deterministic: _Optional[bool] = ..., feature_layers: _Optional[_Iterable[int]] = ..., feature_size: _Optional[int] = ...) -> None: ...

class DraftItem(_message.Message):
    __slots__ = ("request_id", "start", "tokens", "k", "sampling", "features", "features_start")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURES_START_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start: int
    tokens: _common_pb2.Tensor
    k: int
    sampling: _common_pb2.SamplingParams
    features: _common_pb2.Tensor
    features_start: int
    def __init__(self, request_id: _Optional[str] = ..., start: _Optional[int] = ..., tokens: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., k: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., features: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., features_start: _Optional[int] = ...) -> None: ...

class DraftRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DraftItem]
    def __init__(self, items: _Optional[_Iterable[_Union[DraftItem, _Mapping]]] = ...) -> None: ...

class DraftResult(_message.Message):
    __slots__ = ("request_id", "status", "error", "tokens", "probs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status: DraftStatus
    error: str
    tokens: _common_pb2.Tensor
    probs: _common_pb2.DraftDistribution
    def __init__(self, request_id: _Optional[str] = ..., status: _Optional[_Union[DraftStatus, str]] = ..., error: _Optional[str] = ..., tokens: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., probs: _Optional[_Union[_common_pb2.DraftDistribution, _Mapping]] = ...) -> None: ...

class DraftResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DraftResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DraftResult, _Mapping]]] = ...) -> None: ...
