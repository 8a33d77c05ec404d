"""A GGUF file's header read in one pass: its metadata as Python values, its tensors as views of the
mapped file (engine/loader/mapped.py), nothing copied. Torch-free: planning and listing read it too.

The layout is the GGUF specification's (little-endian, versions 2 and 3): magic, version, tensor count,
metadata count; each metadata entry a key (a string: uint64 length, UTF-8 bytes), a value type and a
value (an array: element type, uint64 count, elements); each tensor a name, its dimension count and
dimensions (the fastest-varying first), its ggml type and its data offset, counted from the data section,
which starts at the first multiple of ``general.alignment`` (32 unless said) after the tensor infos.
The types, the quantized types' block sizes and the names come from the gguf package.

Why not gguf's GGUFReader: it builds numpy views for every element of every array (two per string),
3 s for a 49,152-token vocabulary's tokens and merges on a 2-core machine, several times that for a
128k-token Llama 3 vocabulary; here a string array is decoded in one loop and a number array is one view.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from engine.errors import ModelFileError
from engine.loader.mapped import MappedFile

VT = gguf.GGUFValueType
_LENGTH = struct.Struct("<Q")  # a string's byte count
SCALARS = {
    VT.UINT8: "<B",
    VT.INT8: "<b",
    VT.UINT16: "<H",
    VT.INT16: "<h",
    VT.UINT32: "<I",
    VT.INT32: "<i",
    VT.FLOAT32: "<f",
    VT.BOOL: "<?",
    VT.UINT64: "<Q",
    VT.INT64: "<q",
    VT.FLOAT64: "<d",
}
# a tensor's elements as numpy reads them; every other type is read as its bytes (uint8)
ELEMENT_DTYPES = {
    gguf.GGMLQuantizationType.F32: np.float32,
    gguf.GGMLQuantizationType.F16: np.float16,
    gguf.GGMLQuantizationType.F64: np.float64,
    gguf.GGMLQuantizationType.I8: np.int8,
    gguf.GGMLQuantizationType.I16: np.int16,
    gguf.GGMLQuantizationType.I32: np.int32,
    gguf.GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file. ``shape``: the file's dimensions, fastest-varying first (gguf's order);
    ``data``: a view of its bytes in the mapping, [rows..., elements] for the element types and [rows...,
    bytes of a row] for the block types (gguf's reader's shapes)."""

    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class GGUFHeader:
    """The metadata (``fields``: key -> int, float, bool, str or a list of them) and ``tensors`` of a GGUF
    file, in file order; raises ModelFileError for a file that is not a readable GGUF."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.mapped = MappedFile(self.path)
            self._buf = self.mapped.bytes.data  # a memoryview of the whole file
            self._at = 0
            self.fields: dict[str, object] = {}
            self.tensors: list[TensorInfo] = []
            self._read()
        except (ValueError, OSError, IndexError, KeyError, struct.error, UnicodeDecodeError) as exc:
            raise ModelFileError(f"corrupt GGUF file {self.path.name}: {exc}") from None

    def field(self, key: str, default: object = None) -> object:
        """The value of metadata ``key`` (``default`` when the file lacks it)."""
        return self.fields.get(key, default)

    def _read(self) -> None:
        magic, version = self._count("<I"), self._count("<I")
        if magic != gguf.GGUF_MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (supported: 2, 3; a big-endian file reads as neither)")
        tensor_count, field_count = self._count(), self._count()
        for _ in range(field_count):
            key = self._string()
            self.fields[key] = self._value(VT(self._count("<I")))
        infos = [self._tensor_info() for _ in range(tensor_count)]
        alignment = self.fields.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment < 1:
            raise ValueError(f"general.alignment {alignment!r} is not a positive integer")
        start = -(-self._at // alignment) * alignment
        names: set[str] = set()
        for name, dims, kind, offset in infos:
            if name in names:
                raise ValueError(f"tensor {name} appears twice")
            names.add(name)
            self.tensors.append(self._tensor(name, dims, kind, start + offset))

    def _scalar(self, fmt: str) -> int | float | bool:
        (value,) = struct.unpack_from(fmt, self._buf, self._at)
        self._at += struct.calcsize(fmt)
        return value

    def _count(self, fmt: str = "<Q") -> int:
        """An unsigned integer of the header (a count, a length, a type, an offset)."""
        return int(self._scalar(fmt))

    def _string(self) -> str:
        length = self._count()
        end = self._at + length
        if end > len(self._buf):
            raise ValueError("a string runs past the end of the file")
        text = str(self._buf[self._at : end], "utf-8")
        self._at = end
        return text

    def _value(self, kind: gguf.GGUFValueType) -> object:
        if kind == VT.STRING:
            return self._string()
        if kind == VT.ARRAY:
            return self._array(VT(self._count("<I")), self._count())
        return self._scalar(SCALARS[kind])

    def _array(self, kind: gguf.GGUFValueType, count: int) -> list[object]:
        if kind in SCALARS:  # numbers: one view, one conversion
            dtype = np.dtype(SCALARS[kind])
            values = np.frombuffer(self._buf, dtype=dtype, count=count, offset=self._at)
            self._at += count * dtype.itemsize
            return values.tolist()
        if kind == VT.STRING:
            return self._strings(count)  # type: ignore[return-value]
        return [self._value(kind) for _ in range(count)]

    def _strings(self, count: int) -> list[str]:
        """An array of ``count`` strings (a vocabulary, its merges): one tight loop, the hot part of a header."""
        buf, at, end = self._buf, self._at, len(self._buf)
        out: list[str] = []
        length_of, append = _LENGTH.unpack_from, out.append
        for _ in range(count):
            (length,) = length_of(buf, at)
            at += 8
            if at + length > end:
                raise ValueError("a string runs past the end of the file")
            append(str(buf[at : at + length], "utf-8"))
            at += length
        self._at = at
        return out

    def _tensor_info(self) -> tuple[str, tuple[int, ...], gguf.GGMLQuantizationType, int]:
        name = self._string()
        dims = tuple(self._count() for _ in range(self._count("<I")))
        kind = gguf.GGMLQuantizationType(self._count("<I"))
        return name, dims, kind, self._count()

    def _tensor(
        self, name: str, dims: tuple[int, ...], kind: gguf.GGMLQuantizationType, offset: int
    ) -> TensorInfo:
        elements = int(np.prod(dims, dtype=np.int64)) if dims else 1
        block, type_size = gguf.GGML_QUANT_SIZES[kind]
        if elements % block or (dims and dims[0] % block):
            raise ValueError(f"tensor {name}: {dims} is not whole {kind.name} blocks")
        n_bytes = elements // block * type_size
        if offset + n_bytes > self.mapped.size:
            raise ValueError(f"tensor {name} runs past the end of the file")
        rows = tuple(reversed(dims[1:]))
        if kind in ELEMENT_DTYPES:
            data = np.frombuffer(self._buf, ELEMENT_DTYPES[kind], elements, offset).reshape(*rows, -1)
        else:
            data = np.frombuffer(self._buf, np.uint8, n_bytes, offset).reshape(*rows, -1)
        return TensorInfo(name, kind, dims, elements, n_bytes, offset, data)
