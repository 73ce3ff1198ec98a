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
# checkpoint module -> (fused module, part): the fused projections are filled part by part
STACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


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
               device: torch.device | str = "cpu", load_format: str = "safetensors") -> CausalLM:
    """The model with this rank's weights, in eval mode, on `device`. load_format "dummy": random
    weights made on the device (only config.json is read), for benchmarks of large shapes."""
    cfg = ModelConfig.from_folder(folder)
    with _default_dtype(dtype), torch.device(device):
        model = CausalLM(cfg, group)
    if load_format == "dummy":
        init_dummy_weights(model, seed=group.rank)
    else:
        load_weights(model, folder)
    return model.eval()


@torch.no_grad()
def init_dummy_weights(model: CausalLM, *, seed: int = 0, std: float = 0.02) -> None:
    """Norm weights 1, everything else N(0, std), drawn on the parameters' device."""
    for i, (name, p) in enumerate(model.named_parameters()):
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            gen = torch.Generator(device=p.device).manual_seed(seed * 100_003 + i)
            p.normal_(0.0, std, generator=gen)


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
                target, part = _target(name)
                if target not in params:
                    raise ValueError(f"checkpoint tensor {name!r} has no parameter in {type(model).__name__}")
                _load_one(params[target], f.get_slice(name), name, part)
                loaded.add(name if part is None else f"{target}#{part}")
    expected = {f"{n}#{i}" if getattr(p, "num_parts", None) else n
                for n, p in params.items() for i in range(getattr(p, "num_parts", None) or 1)}
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"checkpoint {folder} lacks {missing[:5]}{' ...' if len(missing) > 5 else ''}")


def _target(name: str) -> tuple[str, int | None]:
    """The parameter a checkpoint tensor fills, and the part of a fused one (None: all of it)."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in STACKED:
        fused, part = STACKED[parts[-2]]
        return ".".join(parts[:-2] + [fused, parts[-1]]), part
    return name, None


def _load_one(param: torch.nn.Parameter, checkpoint_slice, name: str, part: int | None = None) -> None:
    loader = getattr(param, "weight_loader", None)
    with torch.no_grad():
        if loader is not None:
            sliced = _CastingSlice(checkpoint_slice, param.dtype)
            loader(param, sliced) if part is None else loader(param, sliced, part)
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
