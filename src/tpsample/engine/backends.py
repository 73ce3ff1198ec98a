"""The ways to run the engine that need no child processes.

- `InProcessBackend`: TP=1 in the caller's process.
- `SpmdBackend`: under `torchrun`, every rank runs the same script, builds `tpsample.LLM`, and
  calls `generate` with the same arguments; rank 0 schedules, the other ranks follow its steps,
  and every rank returns the same outputs. One node or several:

      torchrun --nproc-per-node 8 script.py                                   # one node
      torchrun --nnodes 2 --node-rank R --nproc-per-node 8 \\
               --rdzv-backend c10d --rdzv-endpoint HOST:PORT script.py        # two nodes

  with `LLM(path, tensor_parallel_size=16)` in the script (TP size == world size).
"""
from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist

from tpsample.engine.config import EngineConfig
from tpsample.engine.engine import follow
from tpsample.engine.launch import build_engine, build_rank, init_groups, rank_device, resolve_device
from tpsample.engine.step import EndOfGenerate, Shutdown


def under_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def release_device_memory() -> None:
    """Collect what the engine left in reference cycles, then hand the allocator's cached blocks
    back to the driver (a next LLM sizes its KV cache from the driver's free memory)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class InProcessBackend:
    def __init__(self, cfg: EngineConfig):
        device = rank_device(resolve_device(cfg), 0)
        runner, channel, peaks = build_rank(cfg, tp_group=None, control_group=None, device=device)
        self.engine = build_engine(runner, channel, peaks)
        self.info = self.engine.info

    def generate(self, prompts, params, guided, on_delta):
        outputs = self.engine.generate(prompts, params, guided, on_delta)
        return outputs, self.engine.stats

    def close(self) -> None:
        """Frees the model, KV cache and graphs now, so a next LLM in this process finds the memory."""
        if self.engine is not None:
            self.engine.runner.close()
            self.engine = None
            release_device_memory()


class SpmdBackend:
    def __init__(self, cfg: EngineConfig):
        kind = resolve_device(cfg)
        self._owns_default_group = not dist.is_initialized()
        tp_group, control = init_groups("nccl" if kind == "cuda" else "gloo", timeout_s=cfg.startup_timeout_s)
        if dist.get_world_size() != cfg.tensor_parallel_size:
            raise ValueError(f"tensor_parallel_size={cfg.tensor_parallel_size} must equal the torchrun "
                             f"world size {dist.get_world_size()}")
        self.rank = dist.get_rank()
        device = rank_device(kind, int(os.environ.get("LOCAL_RANK", "0")))
        self.runner, self.channel, peaks = build_rank(cfg, tp_group=tp_group, control_group=control, device=device)
        self.engine = build_engine(self.runner, self.channel, peaks) if self.rank == 0 else None
        info = [self.engine.info if self.engine else None]
        dist.broadcast_object_list(info, src=0, group=control)
        self.info = info[0]

    def generate(self, prompts, params, guided, on_delta):
        if self.engine is None:
            msg = follow(self.runner, self.channel)
            if not isinstance(msg, EndOfGenerate):
                raise RuntimeError("rank 0 shut the engine down")
            if msg.error is not None:
                raise msg.error
            return msg.outputs
        try:
            outputs = self.engine.generate(prompts, params, guided, on_delta)
        except ValueError as e:
            self.channel.send(EndOfGenerate(error=e))
            raise
        self.channel.send(EndOfGenerate(outputs=(outputs, self.engine.stats)))
        return outputs, self.engine.stats

    def close(self) -> None:
        """Collective, like generate: rank 0 sends Shutdown, every other rank waits for it."""
        if self.engine is not None:
            self.engine.shutdown()
        elif not isinstance(self.channel.recv(), Shutdown):
            raise RuntimeError("expected rank 0 to shut the engine down")
        self.runner.close()
        self.engine = self.runner = None
        release_device_memory()
        if self._owns_default_group:        # gloo threads must stop before the interpreter does
            dist.destroy_process_group()
