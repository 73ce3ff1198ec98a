"""Building one rank: process groups, device, runner, and (rank 0) the engine.

Used by every way of running the engine: in-process (TP=1), spawned local workers, torchrun.
The TP group is created explicitly (`new_group` over the TP ranks), never the implicit world
group; steps travel over a gloo group (the same group when the backend already is gloo).
"""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from tpsample.engine.config import EngineConfig
from tpsample.engine.engine import Engine
from tpsample.engine.runner import ModelRunner
from tpsample.engine.step import StepChannel
from tpsample.engine.tokenizer import generation_eos_ids, make_grammar_backend


def resolve_device(cfg: EngineConfig) -> str:
    """cuda when one GPU per local rank is available (or asked for), else cpu."""
    ranks_here = min(cfg.tensor_parallel_size, int(os.environ.get("LOCAL_WORLD_SIZE", cfg.tensor_parallel_size)))
    has_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= ranks_here
    if cfg.device == "cuda" and not has_gpus:
        raise ValueError(f"device='cuda' needs one GPU per rank ({ranks_here}), found "
                         f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    return cfg.device or ("cuda" if has_gpus else "cpu")


def rank_device(kind: str, local_rank: int) -> torch.device:
    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_groups(backend: str, *, rank: int | None = None, world_size: int | None = None,
                init_method: str | None = None, timeout_s: float = 600.0):
    """(tp_group, control_group). Initialises the default group first if nobody did."""
    if not dist.is_initialized():
        kwargs = {} if init_method is None else dict(init_method=init_method, rank=rank, world_size=world_size)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    ranks = list(range(dist.get_world_size()))
    tp_group = dist.new_group(ranks, backend=backend)
    control = tp_group if backend == "gloo" else dist.new_group(ranks, backend="gloo")
    return tp_group, control


def build_rank(cfg: EngineConfig, *, tp_group, control_group, device: torch.device):
    """(runner, channel, per-rank sampler peaks) for this rank; a collective on every rank."""
    runner = ModelRunner(cfg, process_group=tp_group, device=device)
    peaks = runner.sampler_peaks()
    return runner, StepChannel(control_group), peaks


def build_engine(runner: ModelRunner, channel: StepChannel, peaks: list[int]) -> Engine:
    """Rank 0's engine: the runner plus scheduler, grammars and stop tokens."""
    cfg = runner.cfg
    return Engine(runner, channel, grammar=make_grammar_backend(cfg.model, runner.vocab_size),
                  eos_token_ids=generation_eos_ids(cfg.model), sampler_peaks=peaks)
