"""The checkpoint a config implies, and the check that a folder holds exactly that.

`expected_tensors(cfg)`: every tensor of a Llama / Qwen2 checkpoint with this config, by its
checkpoint name, with its full (unsharded) shape and the config fields that give each dimension.

`check_checkpoint(folder, cfg)` reads the headers of the folder's *.safetensors files (never their
tensor data) and raises one ValueError line, naming the file and the tensor, for the first of:
a corrupt file (`read_header`), a tensor held by two files, a dtype that is not floating
point, a shape other than the config implies (an oversized tensor is refused as firmly as a short
one: a rank reads only its slice, so a bigger tensor would otherwise load cut down), tensors the
config implies that no file holds, and tensors the model has no place for. It runs before the
model is built and before any rank takes a slice; returns the files to load.

Tolerated: `lm_head.weight` of a tied model (shape-checked, then ignored) and `rotary_emb.inv_freq`
buffers (ignored: the model computes its own).

A .safetensors file is 8 bytes (little-endian u64 N), N bytes of JSON `{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}`, then the tensor bytes. `read_header`
makes the checks the safetensors library makes when it opens a file (a regular file, a header
length within the file and under 100 MB, a JSON object, entries with a dtype name, a shape and
matching offsets, data that tiles the rest of the file exactly), so a file that passes opens there.
"""
from __future__ import annotations

import glob
import json
import math
import os
import struct
from dataclasses import dataclass

from tpsample.model.config import ModelConfig

FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
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
    """{name: TensorInfo} of one .safetensors file, checked (module docstring)."""
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


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dims: tuple[str, ...]       # the config fields behind each dimension, e.g. ("vocab_size", "hidden_size")


def expected_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """{checkpoint name: full shape and its config fields}; `lm_head.weight` only when untied."""
    q, kv = "num_attention_heads x head_dim", "num_key_value_heads x head_dim"
    sizes = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
             "intermediate_size": cfg.intermediate_size, q: cfg.num_heads * cfg.head_dim,
             kv: cfg.num_kv_heads * cfg.head_dim}
    h, i = "hidden_size", "intermediate_size"
    layer = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
             "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h),
             "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
             "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i)}
    if cfg.qkv_bias:
        layer |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
    if cfg.o_bias:
        layer["self_attn.o_proj.bias"] = (h,)
    if cfg.mlp_bias:
        layer |= {"mlp.gate_proj.bias": (i,), "mlp.up_proj.bias": (i,), "mlp.down_proj.bias": (h,)}
    dims = {"model.embed_tokens.weight": ("vocab_size", h), "model.norm.weight": (h,)}
    dims |= {f"model.layers.{n}.{name}": d for n in range(cfg.num_layers) for name, d in layer.items()}
    if not cfg.tie_word_embeddings:
        dims["lm_head.weight"] = ("vocab_size", h)
    return {name: TensorSpec(tuple(sizes[d] for d in ds), ds) for name, ds in dims.items()}


def checkpoint_files(folder: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(glob.escape(folder), "*.safetensors")))
    if not files:
        raise ValueError(f"model folder {folder} has no *.safetensors files")
    return files


def check_checkpoint(folder: str, cfg: ModelConfig) -> list[str]:
    """The folder's safetensors files, once every tensor in them is what `cfg` implies."""
    want = expected_tensors(cfg)
    optional = {} if not cfg.tie_word_embeddings else {"lm_head.weight": TensorSpec(
        (cfg.vocab_size, cfg.hidden_size), ("vocab_size", "hidden_size"))}
    files, seen, extra = checkpoint_files(folder), {}, []
    for path in files:
        for name, info in sorted(read_header(path).items()):
            if name.endswith(IGNORED_SUFFIXES):
                continue
            if name in seen:
                raise ValueError(f"{path}: tensor {name} is also in {seen[name]}; each tensor must be in one file")
            seen[name] = path
            spec = want.get(name) or optional.get(name)
            if spec is None:
                extra.append((path, name))
                continue
            if info.dtype not in FLOAT_DTYPES:
                raise ValueError(f"{path}: tensor {name} has dtype {info.dtype}, expected a floating-point dtype "
                                 f"({', '.join(FLOAT_DTYPES)})")
            if info.shape != spec.shape:
                raise ValueError(f"{path}: tensor {name} has shape {list(info.shape)}; config.json implies "
                                 f"{list(spec.shape)} ({', '.join(spec.dims)})")
    missing = [name for name in want if name not in seen]
    if missing:
        why = " (config.json: tie_word_embeddings is false)" if "lm_head.weight" in missing else ""
        raise ValueError(f"{folder}: the checkpoint lacks {_some(missing)}, which config.json implies{why}")
    if extra:
        raise ValueError(f"{extra[0][0]}: holds {_some([n for _, n in extra])}, which a {cfg.family} model with "
                         f"this config.json ({cfg.num_layers} layers) does not have")
    return files


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:4])
    return f"{len(names)} tensors: {shown}, ..." if len(names) > 4 else f"tensor(s) {shown}"
