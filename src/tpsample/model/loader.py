"""Build a model and load this rank's shard of an HF safetensors checkpoint folder.

Each parameter reads only its own rows/columns through `safe_open(...).get_slice`, so a rank
never materialises another rank's shard. Tensors are matched by name; parameters without a
`weight_loader` (norms) are replicated and read whole.
"""
from __future__ import annotations

import contextlib
import glob
import os

import torch
from safetensors import safe_open

from tpsample.model.config import ModelConfig
from tpsample.model.llama import CausalLM
from tpsample.model.parallel_layers import TPGroup

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_SKIP_SUFFIXES = ("rotary_emb.inv_freq",)


def resolve_dtype(dtype: str | torch.dtype | None, cfg: ModelConfig) -> torch.dtype:
    """None -> the checkpoint's dtype (fp32 if it does not say); strings by common names."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype must be one of float32, float16, bfloat16, got {dtype}")
        return dtype
    name = dtype if dtype is not None else (cfg.torch_dtype or "float32")
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def load_model(folder: str, group: TPGroup, *, dtype: torch.dtype,
               device: torch.device | str = "cpu") -> CausalLM:
    """The model with this rank's weights, in eval mode, on `device`."""
    cfg = ModelConfig.from_folder(folder)
    with _default_dtype(dtype), torch.device(device):
        model = CausalLM(cfg, group)
    load_weights(model, folder)
    return model.eval()


def load_weights(model: CausalLM, folder: str) -> None:
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(_SKIP_SUFFIXES):
                    continue
                if name == "lm_head.weight" and model.config.tie_word_embeddings:
                    continue
                if name not in params:
                    raise ValueError(f"checkpoint tensor {name!r} has no parameter in {type(model).__name__}")
                _load_one(params[name], f.get_slice(name), name)
                loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"checkpoint {folder} lacks {missing[:5]}{' ...' if len(missing) > 5 else ''}")


def _load_one(param: torch.nn.Parameter, checkpoint_slice, name: str) -> None:
    loader = getattr(param, "weight_loader", None)
    with torch.no_grad():
        if loader is not None:
            loader(param, _CastingSlice(checkpoint_slice, param.dtype))
        else:
            tensor = checkpoint_slice[:]
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(f"{name}: checkpoint {tuple(tensor.shape)} != parameter {tuple(param.shape)}")
            param.copy_(tensor.to(param.dtype))


class _CastingSlice:
    """A safetensors slice whose reads come back in the parameter's dtype."""

    def __init__(self, checkpoint_slice, dtype: torch.dtype):
        self._slice, self._dtype = checkpoint_slice, dtype

    def __getitem__(self, index) -> torch.Tensor:
        return self._slice[index].to(self._dtype)
