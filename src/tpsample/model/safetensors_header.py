"""The header of a .safetensors file, read and checked in Python before any tensor is touched.

Format: 8 bytes (little-endian u64 N), N bytes of JSON `{name: {"dtype", "shape", "data_offsets":
[begin, end]}, "__metadata__": {...}}`, then the tensor bytes, the offsets relative to their start.
`read_header(path)` returns `{name: TensorInfo}` or raises one ValueError line naming the file and
what is wrong: not a regular file, too short, a header length past the end of the file or above
the 100 MB the safetensors library accepts, a header that is not a JSON object, an entry without
a dtype name, a shape of non-negative integers or offsets that match it, or tensor data that
does not tile the rest of the file exactly (a truncated or padded file). These are the checks the
safetensors library makes when it opens a file, so a file that passes them opens there too.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

MAX_HEADER_BYTES = 100_000_000
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
              "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


@dataclass(frozen=True)
class TensorInfo:
    dtype: str                  # the safetensors name: "F32", "BF16", ... (not checked here)
    shape: tuple[int, ...]
    begin: int                  # byte offsets in the data section
    end: int


def read_header(path: str) -> dict[str, TensorInfo]:
    if not os.path.isfile(path):
        raise ValueError(f"{path} is not a regular file (a directory or device named like a safetensors file)")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            raw = f.read(n) if n is not None and n <= min(size - 8, MAX_HEADER_BYTES) else None
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {e.strerror or e}") from None
    if n is None:
        raise ValueError(f"{path} is not a safetensors file: {size} bytes, fewer than the 8 of its header length")
    if n > MAX_HEADER_BYTES or n > size - 8:
        raise ValueError(f"{path} is not a safetensors file (or is truncated): its header length is {n} bytes, "
                         f"the file has {size - 8} after the length (and at most {MAX_HEADER_BYTES} are allowed)")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a safetensors file: its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a safetensors file: its header is not a JSON object")
    header.pop("__metadata__", None)
    tensors = {name: _entry(path, name, e) for name, e in header.items()}
    _check_tiling(path, tensors, size - 8 - n)
    return tensors


def _entry(path: str, name: str, e) -> TensorInfo:
    def bad(why: str) -> ValueError:
        return ValueError(f"{path}: the header entry of tensor {name} {why}, got {e!r}"[:400])

    if not isinstance(e, dict):
        raise bad("is not an object")
    dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad("needs a dtype name")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise bad("needs a shape of integers >= 0")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise bad("needs data_offsets [begin, end] with 0 <= begin <= end")
    if dtype in ITEM_BYTES and offsets[1] - offsets[0] != math.prod(shape) * ITEM_BYTES[dtype]:
        raise bad(f"has data_offsets spanning {offsets[1] - offsets[0]} bytes where its shape and dtype need "
                  f"{math.prod(shape) * ITEM_BYTES[dtype]}")
    return TensorInfo(dtype, tuple(shape), offsets[0], offsets[1])


def _check_tiling(path: str, tensors: dict[str, TensorInfo], data_bytes: int) -> None:
    """The tensors' bytes lie back to back from 0 and end exactly where the file does."""
    at = 0
    for name, t in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if t.begin != at:
            raise ValueError(f"{path}: tensor {name} starts at byte {t.begin} of the data, expected {at} "
                             "(the tensors' bytes must follow one another)")
        at = t.end
    if at != data_bytes:
        what = "is truncated" if at > data_bytes else "has trailing bytes"
        raise ValueError(f"{path} {what}: its header describes {at} bytes of tensor data, the file holds {data_bytes}")
