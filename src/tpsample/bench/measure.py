"""How the sampler benchmarks measure a call: wall time until its results are on the host, its
device time, and the memory it takes above what was there before it.

A measured call is `call()`, which launches the work and returns `finish()`, which reads the
results on the host; `before()`, when given, runs ahead of every call outside what is measured
(refilling logits that an in-place call overwrites).

- `wall_us`: median wall time of call + finish, and median time until call() returned (the
  host's share), each call after a device synchronisation.
- `device_us`: the device time of the calls from the profiler (kernels, memsets and copies on
  the device), per call; the device time of `before()` alone, profiled separately, is taken
  off. `exclude` drops events by name (the TP bench drops the host-staged copies and NCCL
  kernels of collectives). None off CUDA.
- `extra_bytes`: the allocator's peak during one call above what was allocated before it
  (None off CUDA); `allocated()` is what the allocator holds now, for memory a setup keeps.
- `kernel_us`: the device time per call of each kernel by name; `copy_bandwidth`: the
  device-to-device copy bandwidth that achieved bandwidths are stated against.
"""
from __future__ import annotations

import statistics
import time

import torch


def is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def sync(device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def wall_us(call, iters: int, device, before=None) -> tuple[float, float]:
    """(median us of call() + finish(), median us until call() returned)."""
    walls, hosts = [], []
    for _ in range(iters):
        if before is not None:
            before()
        sync(device)
        t0 = time.perf_counter()
        finish = call()
        t1 = time.perf_counter()
        finish()
        t2 = time.perf_counter()
        walls.append((t2 - t0) * 1e6)
        hosts.append((t1 - t0) * 1e6)
    return statistics.median(walls), statistics.median(hosts)


def host_copy_or_nccl(name: str) -> bool:
    """Events of a collective: copies between host and device (gloo stages CUDA tensors through
    host memory; the plan's small uploads go too) and NCCL kernels."""
    return name.startswith(("Memcpy HtoD", "Memcpy DtoH")) or "nccl" in name.lower()


def _profiled(fn, iters: int, device) -> list:
    """The profiler's events (averaged by name) of `iters` calls of fn()."""
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        sync(device)
    return prof.key_averages()


def profiled_us(fn, iters: int, device, exclude=None) -> float:
    """Total device time (us) of the events of `iters` calls of fn(), less the excluded ones."""
    return sum(e.self_device_time_total for e in _profiled(fn, iters, device) if not (exclude and exclude(e.key)))


def kernel_us(fn, iters: int, device, names) -> dict:
    """{kernel: device us per call} of the kernels in `names` fn() launches (after one untimed
    call), longest first."""
    fn()
    got = {e.key: e.self_device_time_total / iters for e in _profiled(fn, iters, device) if e.key in names}
    return {k: round(v, 1) for k, v in sorted(got.items(), key=lambda kv: -kv[1])}


def copy_bandwidth(device) -> float | None:
    """Bytes read + written per second by a device-to-device copy of 1 GiB (after warm-up);
    None off CUDA."""
    if not is_cuda(device):
        return None
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * 10 * src.numel() / (start.elapsed_time(end) / 1e3)


def device_us(call, iters: int, device, before=None, exclude=None, before_us: float | None = None) -> float | None:
    """Device time per call (us), before()'s own device time taken off (profiled here, or
    `before_us` per call when the caller measured it once for several columns); None off CUDA."""
    if not is_cuda(device):
        return None

    def one():
        if before is not None:
            before()
        call()()

    total = profiled_us(one, iters, device, exclude) / iters
    if before is not None:
        total -= before_us if before_us is not None else profiled_us(before, iters, device, exclude) / iters
    return max(total, 0.0)


def allocated(device) -> int | None:
    if not is_cuda(device):
        return None
    sync(device)
    return torch.cuda.memory_allocated(device)


def extra_bytes(call, device, before=None) -> int | None:
    """Allocator peak during one call above the bytes allocated before it; None off CUDA."""
    if not is_cuda(device):
        call()()
        return None
    if before is not None:
        before()
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    call()()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base
