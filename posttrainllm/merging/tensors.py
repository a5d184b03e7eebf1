"""Safetensors read and written one tensor at a time: the merge never holds more than a few tensors.

A safetensors file is an 8-byte little-endian header length, that many bytes of JSON
(``{"<name>": {"dtype": "F32", "shape": [4, 32], "data_offsets": [a, b]}, "__metadata__": {...}}``, the JSON padded
with spaces to a multiple of 8 bytes) and then the tensors' bytes, offsets counted from the end of the header.

Reading uses plain file reads into a fresh buffer per tensor, not a memory map: a map's touched pages stay resident
(and count in the process's RSS) until the file is closed, so streaming two models through maps would hold both.
Writing produces each shard's header first (every shape and dtype is known beforehand) and then each tensor's bytes
as it is computed. Torch only.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 << 20
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class TensorFileError(ValueError):
    """A weights file that cannot be read as safetensors (names the file)."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one stored tensor is: its file, dtype name, shape and byte range (absolute offsets in the file)."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: Path) -> dict[str, TensorInfo]:
    """name → TensorInfo of one safetensors file, from its header only."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 0 < size <= _MAX_HEADER:
                raise TensorFileError(f"{path}: not a safetensors file (header length {size})")
            header = json.loads(f.read(size))
    except (OSError, ValueError) as e:
        raise TensorFileError(f"{path}: cannot read its safetensors header ({e})") from None
    base = 8 + size
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info.get("dtype") not in DTYPES:
            raise TensorFileError(f"{path}: tensor {name} has dtype {info.get('dtype')!r}, which is not supported")
        a, b = info["data_offsets"]
        out[name] = TensorInfo(path, info["dtype"], tuple(int(x) for x in info["shape"]), base + a, base + b)
    return out


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a model directory: the shards its index names, or model.safetensors."""
    d = Path(model_dir)
    if (d / INDEX).is_file():
        try:
            weight_map = json.loads((d / INDEX).read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TensorFileError(f"{d / INDEX}: unreadable index ({e})") from None
        return [d / f for f in sorted(set(weight_map.values()))]
    if (d / SINGLE).is_file():
        return [d / SINGLE]
    raise TensorFileError(f"{d}: no safetensors weights (model.safetensors or {INDEX})")


class SafetensorsSource:
    """The tensors of a model directory's safetensors weights, read one at a time (nothing is held)."""

    def __init__(self, model_dir: Path | str):
        self.files = weight_files(Path(model_dir))
        self.infos: dict[str, TensorInfo] = {}
        for f in self.files:
            self.infos.update(read_header(f))

    def names(self) -> list[str]:
        return list(self.infos)

    def file_of(self, name: str) -> Path | None:
        """The file holding tensor `name`."""
        return self.infos[name].file

    def meta(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        info = self.infos[name]
        return DTYPES[info.dtype], info.shape

    def read(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """The tensor, or only its rows ``[a, b)`` along the first dimension."""
        info = self.infos[name]
        dtype = DTYPES[info.dtype]
        start, shape = info.start, info.shape
        if rows is not None:
            a, b = rows
            row_bytes = info.nbytes // shape[0] if shape and shape[0] else 0
            start, shape = info.start + a * row_bytes, (b - a, *shape[1:])
        nbytes = _nbytes(dtype, shape)
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        buf = bytearray(nbytes)
        with open(info.file, "rb") as f:
            f.seek(start)
            if f.readinto(memoryview(buf)) != nbytes:
                raise TensorFileError(f"{info.file}: tensor {name} is cut short")
        return torch.frombuffer(buf, dtype=dtype).reshape(shape)


class StateDictSource:
    """Tensors already in memory (a LoRA adapter merged into its base), with the same interface."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def names(self) -> list[str]:
        return list(self.tensors)

    def file_of(self, name: str) -> Path | None:
        return None  # in memory

    def meta(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        t = self.tensors[name]
        return t.dtype, tuple(t.shape)

    def read(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        t = self.tensors[name]
        return t if rows is None else t[rows[0] : rows[1]]


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _shards(entries: list[tuple[str, torch.dtype, tuple[int, ...]]], max_bytes: int) -> list[list]:
    shards: list[list] = [[]]
    size = 0
    for entry in entries:
        n = _nbytes(entry[1], entry[2])
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += n
    return shards


def _header_bytes(shard: list) -> bytes:
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in shard:
        n = _nbytes(dtype, shape)
        header[name] = {"dtype": NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _file_names(n: int) -> list[str]:
    return [SINGLE] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]


def planned_weight_files(entries: Iterable[tuple[str, torch.dtype, tuple[int, ...]]], max_shard_bytes: int = 2 << 30):
    """The file names ``write_streamed`` will write for `entries` (known before anything is written)."""
    n = len(_shards(list(entries), max_shard_bytes))
    return _file_names(n) + ([INDEX] if n > 1 else [])


def write_streamed(
    out_dir: Path,
    entries: Iterable[tuple[str, torch.dtype, tuple[int, ...]]],
    produce: Callable[[str], Iterable[torch.Tensor]],
    max_shard_bytes: int = 2 << 30,
) -> list[str]:
    """Write the tensors `entries` lists (name, dtype, shape), each made by ``produce(name)`` only when its turn
    comes as consecutive pieces (blocks of rows along the first dimension, or the whole tensor), into safetensors
    shards of at most `max_shard_bytes` (one tensor may exceed it): ``model.safetensors``, or
    ``model-0000k-of-0000n.safetensors`` plus ``model.safetensors.index.json``. Returns the file names written."""
    entries = list(entries)
    shards = _shards(entries, max_shard_bytes)
    names = _file_names(len(shards))
    weight_map = {}
    for shard, fname in zip(shards, names):
        with open(out_dir / fname, "wb") as f:
            f.write(_header_bytes(shard))
            for name, dtype, shape in shard:
                written = 0
                for t in produce(name):
                    if t.dtype != dtype or tuple(t.shape[1:]) != tuple(shape[1:]):
                        raise ValueError(f"{name}: produced {t.dtype} {tuple(t.shape)}, planned {dtype} {shape}")
                    if t.numel():
                        f.write(memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy()))
                    written += t.numel()
                    del t
                if written != math.prod(shape):
                    raise ValueError(f"{name}: produced {written} elements, planned {math.prod(shape)}")
                weight_map[name] = fname
    if len(names) > 1:
        total = sum(_nbytes(d, s) for _, d, s in entries)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        names.append(INDEX)
    return names
