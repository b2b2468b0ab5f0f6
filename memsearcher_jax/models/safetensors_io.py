"""Minimal safetensors reading (memory-mapped, lazy) and writing, with errors that name the file.

We read the format ourselves instead of through `safetensors.numpy` because (a) numpy has no
bfloat16 and the checkpoints are bf16 (`ml_dtypes` gives us the dtype), (b) a memory map lets
each device read just its shard of a tensor, and (c) a truncated or corrupt file must be
reported, with its name, before anything is compiled.

Format: 8-byte little-endian header length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then data.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable

import ml_dtypes
import numpy as np

from memsearcher_jax.errors import UserInputError

DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(UserInputError):
    """A safetensors file is missing, corrupt, truncated or inconsistent."""


class SafetensorsFile:
    """Lazy view of one .safetensors file: the header is parsed and validated eagerly."""

    def __init__(self, path: str):
        self.path = path
        if not os.path.exists(path):
            raise SafetensorsError(f"safetensors file not found: {path}")
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise SafetensorsError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER or 8 + n > size:
                raise SafetensorsError(f"{path}: corrupt or truncated safetensors header (declares {n} bytes, "
                                       f"file has {size})")
            try:
                header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise SafetensorsError(f"{path}: corrupt safetensors header ({e})") from e
        if not isinstance(header, dict):
            raise SafetensorsError(f"{path}: corrupt safetensors header (not a JSON object)")
        self.metadata = header.pop("__metadata__", {}) or {}
        self._data_start = 8 + n
        self.entries: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            try:
                dtype = DTYPES[info["dtype"]]
                shape = tuple(int(s) for s in info["shape"])
                begin, end = (int(o) for o in info["data_offsets"])
            except (KeyError, TypeError, ValueError) as e:
                raise SafetensorsError(f"{path}: tensor {name!r} has a malformed header entry {info!r}") from e
            if end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
                raise SafetensorsError(f"{path}: tensor {name!r} byte range does not match shape {shape} {dtype}")
            if self._data_start + end > size:
                raise SafetensorsError(
                    f"{path}: truncated: tensor {name!r} ends at byte {self._data_start + end}, file has {size}")
            self.entries[name] = (dtype, shape, begin, end)
        self._mmap: np.memmap | None = None

    def keys(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][1]

    def dtype(self, name: str) -> np.dtype:
        return self.entries[name][0]

    def get(self, name: str) -> np.ndarray:
        """The tensor as a read-only numpy view into the memory map (no copy)."""
        if name not in self.entries:
            raise SafetensorsError(f"{self.path}: no tensor named {name!r}")
        if self._mmap is None:
            self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        dtype, shape, begin, end = self.entries[name]
        buf = self._mmap[self._data_start + begin:self._data_start + end]
        return buf.view(dtype).reshape(shape)


def save_file(tensors: dict[str, np.ndarray], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write tensors to `path` atomically (temp file + rename)."""
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in _NAMES:
            raise SafetensorsError(f"cannot store tensor {name!r} of dtype {arr.dtype} in safetensors")
        header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        arrays.append(arr)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * ((8 - len(blob) % 8) % 8)  # align the data section to 8 bytes
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in arrays:
            f.write(arr.tobytes())
    os.replace(tmp, path)


class TensorDirectory:
    """All tensors of a HF model directory: one model.safetensors or a sharded index."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        index_path = os.path.join(model_dir, "model.safetensors.index.json")
        single = os.path.join(model_dir, "model.safetensors")
        self.files: dict[str, SafetensorsFile] = {}
        self.location: dict[str, str] = {}
        if os.path.exists(index_path):
            try:
                with open(index_path, encoding="utf-8") as f:
                    weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise SafetensorsError(f"{index_path}: not a valid safetensors index (needs a 'weight_map')") from e
            for shard in sorted(set(weight_map.values())):
                self.files[shard] = SafetensorsFile(os.path.join(model_dir, shard))
            for name, shard in weight_map.items():
                if name not in self.files[shard].entries:
                    raise SafetensorsError(f"{index_path} maps {name!r} to {shard}, which does not contain it")
                self.location[name] = shard
        elif os.path.exists(single):
            self.files["model.safetensors"] = SafetensorsFile(single)
            self.location = {k: "model.safetensors" for k in self.files["model.safetensors"].keys()}
        else:
            raise SafetensorsError(
                f"no model.safetensors or model.safetensors.index.json in {model_dir}")

    def keys(self) -> Iterable[str]:
        return self.location.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.files[self.location[name]].shape(name)

    def get(self, name: str) -> np.ndarray:
        return self.files[self.location[name]].get(name)

    def file_of(self, name: str) -> str:
        return os.path.join(self.model_dir, self.location[name])
