"""Run a function on TP ranks as local processes (gloo on CPU, or gloo/NCCL on CUDA devices).

`spawn_ranks(fn, tp, *args)` starts `tp` processes, initialises a process group on a free port
found at run time, calls `fn(group, *args)` on each, and returns the per-rank results. A rank
that raises or dies ends the whole run with a `RuntimeError` carrying its message; nothing waits
past `timeout_s`.

This is the one-shot launcher (a function in, results out) that tests, the demo and the sampler
benchmark use. A long-lived engine needs more: workers that stay up between calls, take requests
and aborts at any time and stream events back; that lives in `tpsample.engine.backends`, which
shares `free_port` with this module.
"""
from __future__ import annotations

import datetime
import os
import queue
import socket
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, tp: int, port: int, backend: str, timeout_s: float, fn, args, results) -> None:
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        # torch is imported by now (unpickling fn), so the variable alone no longer applies: ranks
        # sharing a few cores must not each run a full intra-op thread pool
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            out = fn(dist.group.WORLD, *args)
        finally:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        results.put((rank, True, out))
    except BaseException as exc:  # report to the parent, then exit non-zero
        results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        raise SystemExit(1)


def spawn_ranks(fn, tp: int, *args, backend: str = "gloo", timeout_s: float = 300.0) -> list:
    """fn(group, *args) on ranks 0..tp-1; returns [result of rank 0, ..., rank tp-1]."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, tp, port, backend, timeout_s, fn, args, results), daemon=True)
             for r in range(tp)]
    for p in procs:
        p.start()
    out: dict[int, object] = {}
    errors: list[str] = []
    deadline = timeout_s + 60
    try:
        while len(out) + len(errors) < tp:
            try:
                rank, ok, value = results.get(timeout=deadline)
            except queue.Empty:
                raise RuntimeError(f"TP run timed out after {deadline:.0f}s: ranks {sorted(set(range(tp)) - set(out))} "
                                   "did not report") from None
            if ok:
                out[rank] = value
            else:
                errors.append(f"rank {rank}: {value}")
                break
            dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in out]
            if dead and results.empty():
                errors.append(f"rank(s) {dead} exited with codes {[procs[i].exitcode for i in dead]}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
            if p.is_alive():
                p.terminate()
    if errors:
        raise RuntimeError("TP run failed: " + "; ".join(e.splitlines()[0] for e in errors) + "\n" + errors[0])
    return [out[r] for r in range(tp)]
