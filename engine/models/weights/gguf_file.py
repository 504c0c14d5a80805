"""The GGUF container, parsed directly: header, metadata and tensor directory, tensors memory-mapped.

The ``gguf`` package's reader builds a numpy view for every part of every field; on SmolLM2's tokenizer
(100k strings) that is ~8 s of a ~11 s model load, paid by every process that loads the model. Here the
metadata is walked with ``struct`` over one memory map (well under a second) and numeric arrays come out
of ``np.frombuffer`` whole. Dequantization stays with ``gguf.quants``: ``GGUFTensor.data`` has the shape and
dtype the ``gguf`` reader gives (elements for F32/F16/F64 and integer types, bytes for the rest).
Little-endian files (every GGUF llama.cpp writes on x86 and ARM) only.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# tensor types stored as elements (everything else: bytes, dequantized by gguf.quants)
_ELEMENT_TYPES = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64,
                  28: np.float64}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: Any        # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: fastest-varying dimension first
    data: np.ndarray        # read-only, memory-mapped


class GGUFContents:
    """``fields`` (metadata key -> value: str, int, float, bool or a list of them) and ``tensors``."""

    def __init__(self, path: str | Path) -> None:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quant_shape_to_byte_shape

        with open(path, "rb") as fh:
            self._buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        buf = self._buf
        if buf[:4] != MAGIC:
            raise ValueError(f"bad magic {bytes(buf[:4])!r}, expected {MAGIC!r}")
        version, n_tensors, n_fields = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 or 3; a big-endian file reads as "
                             "a huge version)")
        self._pos = 24
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self._string()
            (kind,) = self._unpack("<I")
            self.fields[key] = self._value(kind)
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            dims = self._unpack(f"<{n_dims}Q")
            kind, offset = self._unpack("<IQ")
            infos.append((name, dims, kind, offset))
        align = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-self._pos // align) * align
        raw = np.frombuffer(buf, dtype=np.uint8)
        self.tensors: list[GGUFTensor] = []
        for name, dims, kind, offset in infos:
            qtype = GGMLQuantizationType(kind)
            n = int(np.prod(dims))
            np_dims = tuple(reversed(dims))
            block, size = GGML_QUANT_SIZES[qtype]
            begin = start + offset
            if kind in _ELEMENT_TYPES:
                dt = np.dtype(_ELEMENT_TYPES[kind])
                data = raw[begin: begin + n * dt.itemsize].view(dt).reshape(np_dims)
            else:
                data = raw[begin: begin + n * size // block].reshape(quant_shape_to_byte_shape(np_dims, qtype))
            self.tensors.append(GGUFTensor(name, qtype, dims, data))

    def _unpack(self, fmt: str) -> tuple:
        out = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return out

    def _string(self) -> str:
        (n,) = struct.unpack_from("<Q", self._buf, self._pos)
        start = self._pos + 8
        self._pos = start + n
        return self._buf[start: start + n].decode("utf-8")

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind in _SCALARS:
            return self._unpack(_SCALARS[kind])[0]
        if kind != _ARRAY:
            raise ValueError(f"unknown metadata value type {kind} at byte {self._pos}")
        item, count = self._unpack("<IQ")
        if item == _STRING:
            return [self._string() for _ in range(count)]
        if item in _SCALARS:
            dt = np.dtype(_SCALARS[item])
            values = np.frombuffer(self._buf, dtype=dt, count=count, offset=self._pos)
            self._pos += count * dt.itemsize
            return values.tolist()
        return [self._value(item) for _ in range(count)]  # arrays of arrays
