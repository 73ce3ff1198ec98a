"""The ways to run the engine, and building one rank for each.

- `InProcessBackend`: TP=1 in the caller's process.
- `SpmdBackend`: under `torchrun`, every rank runs the same script, builds `tpsample.LLM`, and
  calls `generate` with the same arguments; rank 0 runs the engine core, the other ranks follow
  its steps, and every rank returns the same outputs. One node or several:

      torchrun --nproc-per-node 8 script.py                                   # one node
      torchrun --nnodes 2 --node-rank R --nproc-per-node 8 \\
               --rdzv-backend c10d --rdzv-endpoint HOST:PORT script.py        # two nodes

  with `LLM(path, tensor_parallel_size=16)` in the script (TP size == world size).
- `MultiprocBackend`: TP>1 on one host without torchrun: one spawned worker process per rank.
  The caller talks to rank 0 over a pipe: rank 0 runs the engine core (`engine.core.serve_core`),
  taking requests and aborts at any time and sending events back; the other ranks follow rank
  0's steps. A worker that dies or raises, or a step with no answer within `step_timeout_s`,
  stops all workers and raises RuntimeError naming the rank (with the worker's traceback); a
  ValueError raised in a worker (a checkpoint or setting the rank refuses) stops them too and
  comes back as a ValueError of one line, the worker's message after the rank's name. A bad
  request comes back as ValueError and the engine stays usable.

  A worker never outlives its parent (it exits within `PARENT_WATCH_S` of its death); workers
  live in their own process group, so a terminal's Ctrl-C reaches the parent alone, which stops
  them; SIGINT or SIGTERM sent to a worker ends it at once. `close` stops the workers within
  `CLOSE_TIMEOUT_S`, then terminates and at last kills what is left.

Every rank is built the same way (`build_rank`): the TP group is created explicitly (`new_group`
over the TP ranks), never the implicit world group; steps travel over a gloo group (the same
group when the backend already is gloo).
"""
from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tpsample.engine.config import EngineConfig
from tpsample.engine.core import LocalClient, WorkerClient, serve_core
from tpsample.engine.engine import Engine, follow
from tpsample.engine.hf_files import generation_eos_ids
from tpsample.engine.runner import ModelRunner
from tpsample.engine.step import EndOfGenerate, Shutdown, StepChannel
from tpsample.engine.structured import make_grammar_backend
from tpsample.numerics import release_device_memory
from tpsample.parallel.launch import free_port

PARENT_WATCH_S = 0.25
CLOSE_TIMEOUT_S = 4.0
DEATH_GRACE_S = 2.0        # how long a rank's failure waits for a peer's death to show (the likelier cause)


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


def build_rank(cfg: EngineConfig, *, tp_group, control_group, device: torch.device, rank0: bool):
    """(runner, step channel, engine) of this rank, the engine (scheduler, grammars, stop tokens)
    on rank 0 only, else None; a collective on every rank."""
    runner = ModelRunner(cfg, process_group=tp_group, device=device)
    peaks, channel = runner.sampler_peaks(), StepChannel(control_group)
    if not rank0:
        return runner, channel, None
    return runner, channel, Engine(runner, channel, grammar=make_grammar_backend(cfg.model, runner.vocab_size),
                                   eos_token_ids=generation_eos_ids(cfg.model), sampler_peaks=peaks)


def under_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


class InProcessBackend:
    def __init__(self, cfg: EngineConfig):
        device = rank_device(resolve_device(cfg), 0)
        _, _, self.engine = build_rank(cfg, tp_group=None, control_group=None, device=device, rank0=True)
        self.info = self.engine.info
        self._client = LocalClient(self.engine)

    def client(self) -> LocalClient:
        return self._client

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
        self.runner, self.channel, self.engine = build_rank(cfg, tp_group=tp_group, control_group=control,
                                                            device=device, rank0=self.rank == 0)
        info = [self.engine.info if self.engine else None]
        dist.broadcast_object_list(info, src=0, group=control)
        self.info = info[0]
        self._client = LocalClient(self.engine) if self.engine is not None else None

    def client(self) -> LocalClient | None:
        """Rank 0's engine core; None on the ranks that follow (they call `follow_generate`)."""
        return self._client

    def follow_generate(self):
        """Ranks > 0: run rank 0's steps until its generate() ends; return what it returned."""
        msg = follow(self.runner, self.channel)
        if not isinstance(msg, EndOfGenerate):
            raise RuntimeError("rank 0 shut the engine down")
        if msg.error is not None:
            raise msg.error
        return msg.outputs

    def end_generate(self, outputs=None, error: BaseException | None = None) -> None:
        """Rank 0: release the following ranks with the outputs (or the error) of generate()."""
        self.channel.send(EndOfGenerate(outputs=outputs, error=error))

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


def _detach_from_parent_signals() -> None:
    """Own process group (a terminal's Ctrl-C goes to the parent only), default SIGINT/SIGTERM
    (they end the process at once, even inside a blocking collective), and exit if the parent dies."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_WATCH_S)
        os._exit(1)

    threading.Thread(target=watch, name="tpsample-parent-watch", daemon=True).start()


def _worker(rank: int, cfg: EngineConfig, port: int, kind: str, conn) -> None:
    _detach_from_parent_signals()
    try:
        world = cfg.tensor_parallel_size
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        tp_group, control = init_groups("nccl" if kind == "cuda" else "gloo", rank=rank, world_size=world,
                                        init_method=f"tcp://127.0.0.1:{port}", timeout_s=cfg.startup_timeout_s)
        runner, channel, engine = build_rank(cfg, tp_group=tp_group, control_group=control,
                                             device=rank_device(kind, rank), rank0=rank == 0)
        if engine is None:
            conn.send(("ready", None))
            follow(runner, channel)
        else:
            conn.send(("ready", engine.info))
            serve_core(engine, conn)
        dist.destroy_process_group()
    except BaseException as exc:
        try:       # a ValueError is the user's to read: its one line, not a traceback
            usage = isinstance(exc, ValueError)
            conn.send(("fatal", " ".join(str(exc).split()) if usage else traceback.format_exc(), usage))
        finally:
            sys.exit(1)


class MultiprocBackend:
    def __init__(self, cfg: EngineConfig):
        self.cfg, self._closed = cfg, False
        kind = resolve_device(cfg)
        ctx = mp.get_context("spawn")
        port = free_port()
        self.procs, self.conns = [], []
        self._inbox: list[list] = [[] for _ in range(cfg.tensor_parallel_size)]
        for rank in range(cfg.tensor_parallel_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, cfg, port, kind, child), daemon=True,
                               name=f"tpsample-rank{rank}")
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        for rank in range(cfg.tensor_parallel_size):
            msg = self._receive(rank, cfg.startup_timeout_s, "start-up")
            if rank == 0:
                self.info = msg[1]

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _receive(self, rank: int, timeout_s: float, what: str):
        """The next message from `rank`, while watching every worker for death or failure."""
        deadline = time.monotonic() + timeout_s
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs)}
        while True:
            if self._inbox[rank]:
                return self._inbox[rank].pop(0)
            left = deadline - time.monotonic()
            ready = wait(self.conns + list(sentinels), timeout=max(0.0, left))
            if not ready:
                self._fail(f"no answer from rank {rank} within {timeout_s:.0f} s during {what}")
            for obj in ready:
                if obj in self.conns:
                    r = self.conns.index(obj)
                    try:
                        msg = obj.recv()
                    except EOFError:
                        continue                    # the sentinel reports the exit
                    if msg[0] == "fatal" and msg[2]:
                        self._fail(f"rank {r} failed during {what}: {msg[1]}", ValueError)
                    if msg[0] == "fatal":
                        self._fail_with_root_cause(r, what, msg[1])
                    self._inbox[r].append(msg)
            for obj in ready:
                if obj in sentinels:
                    r = sentinels[obj]
                    self.procs[r].join(timeout=1)       # reap it, so its exit code is known
                    self._fail(f"worker rank {r} died during {what} ({_exit_text(self.procs[r].exitcode)})")

    def _fail_with_root_cause(self, rank: int, what: str, trace: str):
        """A rank's failure; when another worker died (a killed rank makes its peers' collectives
        fail first), the death is the cause reported. Waits briefly for that death to show."""
        others = {p.sentinel: r for r, p in enumerate(self.procs) if r != rank}
        for obj in wait(list(others), timeout=DEATH_GRACE_S):
            r = others[obj]
            self.procs[r].join(timeout=1)
            if self.procs[r].exitcode not in (None, 0, 1):       # 1: a rank that reported its own failure
                self._fail(f"worker rank {r} died during {what} ({_exit_text(self.procs[r].exitcode)})")
        self._fail(f"rank {rank} failed during {what}:\n{trace}")

    def _fail(self, why: str, error: type[Exception] = RuntimeError):
        """Stop every worker and raise; a configuration error found by a rank stays a ValueError."""
        self.close(force=True)
        raise error(f"tpsample engine stopped: {why}")

    def client(self) -> WorkerClient:
        """The engine core's client (requests, aborts, events); see `engine.core`."""
        return WorkerClient(self)

    def close(self, force: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if not force:
            try:
                self.conns[0].send(("shutdown",))
            except (BrokenPipeError, OSError):
                pass
        _join_all(self.procs, 0 if force else CLOSE_TIMEOUT_S)
        for stop in ("terminate", "kill"):
            alive = [p for p in self.procs if p.is_alive()]
            for p in alive:
                getattr(p, stop)()
            _join_all(alive, 2.0)


def _join_all(procs, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"
