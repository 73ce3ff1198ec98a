"""TP>1 on one host without torchrun: one spawned worker process per rank, rank 0 driving.

The caller's process starts the workers (torch.multiprocessing spawn), finds a free port at run
time, and talks to rank 0 over a pipe: rank 0 runs the engine core (`engine.core.serve_core`),
taking requests and aborts at any time and sending events back; the other ranks follow rank 0's
steps. The caller watches every worker: a worker that dies or raises, or a
step with no answer within `step_timeout_s`, stops all workers and raises RuntimeError naming the
rank (with the worker's traceback). A ValueError raised in a worker (a checkpoint or setting the
rank refuses) stops them too and comes back as a ValueError of one line, the worker's message
after the rank's name, as the command line prints it. A bad request comes back as ValueError and
the engine stays usable.

Process hygiene: a worker never outlives its parent (each watches it and exits within
`PARENT_WATCH_S` of its death, whatever killed it); workers live in their own process group, so
a terminal's Ctrl-C reaches the parent alone, which stops them; SIGINT or SIGTERM sent to a
worker itself ends it at once (the parent then sees a dead worker, as above). `close` stops the
workers within `CLOSE_TIMEOUT_S`, then terminates and at last kills what is left.

(`tpsample.parallel.launch.spawn_ranks` is the one-shot counterpart: run a function on TP ranks
and return the results; these workers instead live as long as the engine.)
"""
from __future__ import annotations

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
from tpsample.engine.core import WorkerClient, serve_core
from tpsample.engine.engine import follow
from tpsample.engine.launch import build_engine, build_rank, init_groups, rank_device, resolve_device
from tpsample.parallel.launch import free_port

PARENT_WATCH_S = 0.25
CLOSE_TIMEOUT_S = 4.0


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
        runner, channel, peaks = build_rank(cfg, tp_group=tp_group, control_group=control,
                                            device=rank_device(kind, rank))
        if rank != 0:
            conn.send(("ready", None))
            follow(runner, channel)
        else:
            engine = build_engine(runner, channel, peaks)
            conn.send(("ready", engine.info))
            _serve(engine, conn)
        dist.destroy_process_group()
    except BaseException as exc:
        try:       # a ValueError is the user's to read: its one line, not a traceback
            usage = isinstance(exc, ValueError)
            conn.send(("fatal", " ".join(str(exc).split()) if usage else traceback.format_exc(), usage))
        finally:
            sys.exit(1)


def _serve(engine, conn) -> None:
    cmd = conn.recv()
    if cmd[0] == "shutdown":
        engine.shutdown()
    else:
        serve_core(engine, conn, cmd[1])


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
                        self._fail(f"rank {r} failed during {what}:\n{msg[1]}")
                    self._inbox[r].append(msg)
            for obj in ready:
                if obj in sentinels:
                    r = sentinels[obj]
                    self.procs[r].join(timeout=1)       # reap it, so its exit code is known
                    self._fail(f"worker rank {r} died during {what} ({_exit_text(self.procs[r].exitcode)})")

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
