"""The checkpoint a config implies, and the check that a folder holds exactly that.

`expected_tensors(cfg)`: every tensor of a Llama / Qwen2 checkpoint with this config, by its
checkpoint name, with its full (unsharded) shape and the config fields that give each dimension.

`check_checkpoint(folder, cfg)` reads the headers of the folder's *.safetensors files (never their
tensor data) and raises one ValueError line, naming the file and the tensor, for the first of:
a corrupt file (`safetensors_header`), a tensor held by two files, a dtype that is not floating
point, a shape other than the config implies (an oversized tensor is refused as firmly as a short
one: a rank reads only its slice, so a bigger tensor would otherwise load cut down), tensors the
config implies that no file holds, and tensors the model has no place for. It runs before the
model is built and before any rank takes a slice; returns the files to load.

Tolerated: `lm_head.weight` of a tied model (shape-checked, then ignored) and `rotary_emb.inv_freq`
buffers (ignored: the model computes its own).
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from tpsample.model.config import ModelConfig
from tpsample.model.safetensors_header import read_header

FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


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
