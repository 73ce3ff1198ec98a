"""Build a model and load this rank's shard of an HF safetensors checkpoint folder.

First the whole checkpoint is checked against the config (`checkpoint.check_checkpoint`: files,
names, dtypes and full shapes, from the headers alone), before the model is built. Then each
parameter reads only its own rows/columns through `safe_open(...).get_slice`, so a rank never
materialises another rank's shard. Tensors are matched by name; parameters without a
`weight_loader` (norms) are replicated and read whole. Every user-facing failure is a one-line
ValueError naming the file and the checkpoint tensor.
"""
from __future__ import annotations

import contextlib

import torch
from safetensors import SafetensorError, safe_open

from tpsample.model.checkpoint import IGNORED_SUFFIXES, check_checkpoint
from tpsample.model.config import ModelConfig
from tpsample.model.llama import CausalLM
from tpsample.model.parallel_layers import TPGroup
from tpsample.numerics import DTYPE_NAMES, DTYPES

# checkpoint module -> (fused module, part): the fused projections are filled part by part
STACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def resolve_dtype(dtype: str | torch.dtype | None, cfg: ModelConfig) -> torch.dtype:
    """None -> the checkpoint's dtype (fp32 if it does not say); strings by common names."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {dtype}")
        return dtype
    if dtype is None and cfg.torch_dtype is not None and cfg.torch_dtype not in DTYPES:
        raise ValueError(f"config.json torch_dtype {cfg.torch_dtype!r} is not one of {sorted(DTYPES)}; "
                         "pass a dtype (--dtype) to choose one")
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
    files = None if load_format == "dummy" else check_checkpoint(folder, cfg)
    with _default_dtype(dtype), torch.device(device):
        model = CausalLM(cfg, group)
    if files is None:
        init_dummy_weights(model, seed=group.rank)
    else:
        _fill(model, files)
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


def _fill(model: CausalLM, files: list[str]) -> None:
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for path in files:
        with _open(path) as f:
            for name in f.keys():  # noqa: SIM118  (a safe_open handle, not a dict)
                if name.endswith(IGNORED_SUFFIXES):
                    continue
                if name == "lm_head.weight" and model.config.tie_word_embeddings:
                    continue
                target, part = _target(name)
                _load_one(params[target], CheckpointSlice(name, f.get_slice(name), params[target].dtype), part)
                loaded.add(name if part is None else f"{target}#{part}")
    expected = {f"{n}#{i}" if getattr(p, "num_parts", None) else n
                for n, p in params.items() for i in range(getattr(p, "num_parts", None) or 1)}
    if loaded != expected:        # check_checkpoint and the name mapping disagree: a bug here, not in the files
        raise RuntimeError(f"the checked checkpoint left parameters unfilled: {sorted(expected - loaded)[:5]}")


@contextlib.contextmanager
def _open(path: str):
    """safe_open, its failures (the file changed since its header was checked) as ValueError."""
    try:
        f = safe_open(path, framework="pt", device="cpu")
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path} cannot be opened as a safetensors file: {' '.join(str(e).split())}") from None
    with f:
        yield f


def _target(name: str) -> tuple[str, int | None]:
    """The parameter a checkpoint tensor fills, and the part of a fused one (None: all of it)."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in STACKED:
        fused, part = STACKED[parts[-2]]
        return ".".join(parts[:-2] + [fused, parts[-1]]), part
    return name, None


def _load_one(param: torch.nn.Parameter, checkpoint_slice: CheckpointSlice, part: int | None = None) -> None:
    loader = getattr(param, "weight_loader", None)
    with torch.no_grad():
        if loader is not None:
            loader(param, checkpoint_slice) if part is None else loader(param, checkpoint_slice, part)
        else:
            tensor = checkpoint_slice[:]
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(f"{checkpoint_slice.name}: checkpoint {tuple(tensor.shape)} != parameter "
                                 f"{tuple(param.shape)}")
            param.copy_(tensor)


class CheckpointSlice:
    """A checkpoint tensor as the parameters' weight loaders see it: its checkpoint `name` (for
    their errors), and reads (`[index]`) that come back in the parameter's dtype."""

    def __init__(self, name: str, checkpoint_slice, dtype: torch.dtype):
        self.name, self._slice, self._dtype = name, checkpoint_slice, dtype

    def __getitem__(self, index) -> torch.Tensor:
        return self._slice[index].to(self._dtype)
