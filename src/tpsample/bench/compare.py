"""`tpsample bench sampler --compare`: one sampling call as an engine sees it, side by side.

On the same logits in one process: tpsample's `plan` + `sample` + reading the tokens on the host
(the wall time an engine pays per step, host and device), its device time (sum of kernel
times), the host share (time until `sample` returns, which launches work without waiting), and
the extra memory above the inputs; next to FlashInfer's `top_k_top_p_sampling_from_logits`
(when it imports), a torch sort-based top-k/top-p sampler, and `argmax().tolist()`.
Cases: greedy, temperature only, top-k 50 + top-p 0.9 (T 0.8), top-p 0.9 alone, top-k 50 alone,
min-p 0.05 alone, top-k 50 + top-p 0.9 with logprobs=5, and the same with repetition 1.1 /
frequency 0.2 penalties over 2,000-token prompts and growing outputs (at the first row count
only). FlashInfer's anchors take per-row tensor parameters, as vLLM and SGLang pass them: for
top-p, min-p and top-k alone vLLM's own calls (softmax, then the `*_from_probs` op). Every case is timed three ways: eager over one logits buffer (`tpsample eager`: plan + sample
per call, which the sampler's auto_graph replays from a graph after a few identical calls),
eager over a new buffer every call (`tpsample eager, new buffer`: never replayed, the launch
path's own cost; not for the in-place penalties case, which is never replayed), and as the same
step captured once with `Sampler.capture` and replayed (`tpsample graph`, what an engine that
graphs its decode step pays); and, for the cases without penalties, the stateless
`tpsample.ops.sample` over per-row tensors (`tpsample ops`). Prints a table, writes the plot (`--plot`: `plots.plot_compare`)
and ends with one JSON line. Untimed calls of the first case run before any is measured, and
every wall time is taken before the first profiled call (device times and memory come from a
second sweep over the same logits).
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field

import torch

PROMPT_LEN = 2000


@dataclass(frozen=True)
class Case:
    name: str
    params: dict = field(default_factory=dict)
    prompt_len: int = 1
    anchors: tuple[str, ...] = ()


CASES = (
    Case("greedy", {"temperature": 0.0}, anchors=("argmax",)),
    Case("temperature", {"temperature": 0.8}, anchors=("flashinfer", "torch_multinomial")),
    Case("topk_topp", {"temperature": 0.8, "top_k": 50, "top_p": 0.9}, anchors=("flashinfer", "torch_sort")),
    Case("topp", {"temperature": 0.8, "top_p": 0.9}, anchors=("flashinfer", "torch_sort")),
    Case("topk", {"temperature": 0.8, "top_k": 50}, anchors=("flashinfer",)),
    Case("minp", {"temperature": 0.8, "min_p": 0.05}, anchors=("flashinfer",)),
    Case("topp_minp", {"temperature": 0.7, "top_p": 0.9, "min_p": 0.05}),     # FlashInfer has no such op
    Case("topk_topp_lp5", {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "logprobs": 5}),
    Case("topk_topp_pen", {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "repetition_penalty": 1.1,
                                 "frequency_penalty": 0.2}, prompt_len=PROMPT_LEN),
)


def _sync():
    torch.cuda.synchronize()


def _peak_extra(fn, device) -> float:
    """MiB allocated above the inputs during one call."""
    _sync()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    _sync()
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def _device_us(fn, iters: int) -> float:
    from torch.profiler import ProfilerActivity, profile
    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        _sync()
    return sum(e.self_device_time_total for e in prof.key_averages()) / iters


def _wall_us(fn, iters: int, before=None) -> tuple[float, float]:
    """(median wall us of fn(), median us until fn's launch part returned) -- fn returns a
    callable that finishes the call (reads results), so host time is measured separately."""
    walls, hosts = [], []
    for _ in range(iters):
        if before is not None:
            before()
        _sync()
        t0 = time.perf_counter()
        finish = fn()
        t1 = time.perf_counter()
        finish()
        t2 = time.perf_counter()
        walls.append((t2 - t0) * 1e6)
        hosts.append((t1 - t0) * 1e6)
    return statistics.median(walls), statistics.median(hosts)


def case_sampler(case: Case, rows: int, vocab: int, device=None, prompt_len: int | None = None):
    """(sampler, request ids): `rows` seeded requests with the case's parameters and random
    prompts of the case's length (or `prompt_len`); in place when the case has prompts, as an
    engine samples them."""
    import tpsample
    s = tpsample.Sampler(vocab, max_num_reqs=rows, strategy="replicated", seed=1, device=device,
                         inplace_logits=case.prompt_len > 1, max_logprobs=20)
    g = torch.Generator().manual_seed(0)
    for i in range(rows):
        prompt = torch.randint(0, vocab, (prompt_len or case.prompt_len,), generator=g).tolist()
        s.add_request(f"r{i}", tpsample.SamplingParams(seed=i, max_tokens=10**6, **case.params), prompt)
    return s, [f"r{i}" for i in range(rows)]


def _tpsample(case: Case, x: torch.Tensor, iters: int, phase: str) -> list[dict]:
    rows, vocab = x.shape
    inplace = case.prompt_len > 1
    s, ids = case_sampler(case, rows, vocab, x.device)
    work = x.clone() if inplace else x
    refill = (lambda: work.copy_(x)) if inplace else None

    def call():
        out = s.sample(work, s.plan(ids))
        return lambda: (out.token_lists(), out.logprobs)

    out = [{"impl": "tpsample eager", **_measure(call, iters, refill, x.device, phase)}]
    if not inplace:     # a new logits buffer every call: no graph; after a few calls the launch-list replay
        bufs, turn = (x, x.clone()), [0]

        def call_new():
            turn[0] ^= 1
            o = s.sample(bufs[turn[0]], s.plan(ids))
            return lambda: (o.token_lists(), o.logprobs)

        out.append({"impl": "tpsample eager, new buffer", **_measure(call_new, iters, None, x.device, phase)})
        del bufs
    # what an engine that graphs its decode step pays: the same step captured once and replayed
    # (the buffer refilled before each replay when the sampler works in place, as the LM head would)
    if refill:
        refill()
    step = s.capture(s.plan(ids), work, reserve_tokens=4 * iters + 64)

    def replay():
        out = step.replay()
        return lambda: (out.token_lists(), out.logprobs)

    out.append({"impl": "tpsample graph", **_measure(replay, iters, refill, x.device, phase)})
    if not inplace:
        out.append({"impl": "tpsample ops", **_measure(_ops_call(case, x), iters, None, x.device, phase)})
    return out


def _ops_call(case: Case, x: torch.Tensor):
    """`tpsample.ops.sample` with per-row tensor parameters an engine already holds (built once,
    outside the timed calls), seeded per row like the sampler's requests."""
    from tpsample import ops
    rows, dev, p = x.shape[0], x.device, case.params

    def full(v, dtype):
        return torch.full((rows,), v, dtype=dtype, device=dev)

    kw = {"temperature": full(p.get("temperature", 1.0), torch.float32),
          "top_k": full(p.get("top_k", 0), torch.int32), "top_p": full(p.get("top_p", 1.0), torch.float32),
          "min_p": full(p.get("min_p", 0.0), torch.float32),
          "seeds": torch.arange(rows, dtype=torch.int64, device=dev), "positions": full(1, torch.int64),
          "logprobs": p.get("logprobs")}

    def call():
        o = ops.sample(x, **kw)
        return lambda: (o.token_ids.tolist(), o.logprobs)
    return call


def _measure(call, iters: int, refill, device, phase: str) -> dict:
    """Warm-up, then (phase "wall") wall and host time, or (phase "device") device time and
    extra memory of call()() (refill() before the warm-up and timed calls when given: an
    in-place sampler overwrites its input)."""
    def run():
        if refill:
            refill()
        call()()

    # the device sweep warms up as long as the wall sweep did (3 + iters calls), so the sampler's
    # automatic graph is in use by the profiled calls in both
    for _ in range(3 if phase == "wall" else 3 + iters):
        run()
    if phase == "wall":
        wall, host = _wall_us(call, iters, refill)
        return {"wall_us": wall, "host_us": host}
    if refill:                  # refilled outside the profiled calls (a copy is no sampling work)
        refill()
    device_us = _device_us(lambda: call()(), 3)
    if refill:
        refill()
    return {"device_us": device_us, "extra_mib": _peak_extra(lambda: call()(), device)}


def _anchor(name: str, case: Case, x: torch.Tensor, iters: int, phase: str) -> dict | None:
    p = case.params
    rows = x.shape[0]
    if name == "argmax":
        def call():
            t = x.argmax(dim=1)
            return lambda: t.tolist()
    elif name == "torch_multinomial":
        def call():
            t = torch.multinomial(torch.softmax(x / p["temperature"], dim=1), 1)
            return lambda: t.tolist()
    elif name == "torch_sort":
        def call():
            t = _torch_sort_sample(x, p["temperature"], p.get("top_k", x.shape[1]), p.get("top_p", 1.0))
            return lambda: t.tolist()
    elif name == "flashinfer":
        call = _flashinfer_call(p, x)
        if call is None:
            return None
    else:
        raise ValueError(name)
    for _ in range(3):
        call()()
    if phase == "wall":
        wall, host = _wall_us(call, iters)
        return {"impl": name, "wall_us": wall, "host_us": host}
    return {"impl": name, "device_us": _device_us(lambda: call()(), 3),
            "extra_mib": _peak_extra(lambda: call()(), x.device)}


def _flashinfer_call(p: dict, x: torch.Tensor):
    """FlashInfer's call for the case's parameters (per-row tensors), or None when it does not
    import or lacks the op."""
    try:
        import flashinfer.sampling as fs
    except Exception as e:  # noqa: BLE001 - absent or incompatible: say so and skip it
        print(f"flashinfer anchor skipped: {e!r}"[:160])
        return None
    rows, dev, temp = x.shape[0], x.device, p["temperature"]

    def full(v, dtype):
        return torch.full((rows,), v, dtype=dtype, device=dev)

    if "top_k" in p and "top_p" in p:
        k, tp = full(p["top_k"], torch.int32), full(p["top_p"], torch.float32)
        op = lambda: fs.top_k_top_p_sampling_from_logits(x / temp, k, tp)       # noqa: E731
    elif "top_p" in p:
        tp = full(p["top_p"], torch.float32)
        op = lambda: fs.top_p_sampling_from_probs(torch.softmax(x / temp, dim=1), tp)      # noqa: E731
    elif "top_k" in p:
        k = full(p["top_k"], torch.int32)
        op = lambda: fs.top_k_sampling_from_probs(torch.softmax(x / temp, dim=1), k)       # noqa: E731
    elif "min_p" in p:
        mp = full(p["min_p"], torch.float32)
        op = lambda: fs.min_p_sampling_from_probs(torch.softmax(x / temp, dim=1), mp)      # noqa: E731
    else:
        op = lambda: fs.sampling_from_logits(x / temp)                                   # noqa: E731

    def call():
        t = op()
        return lambda: t.tolist()
    return call


def _torch_sort_sample(x, temperature, top_k, top_p):
    """The usual sort-based top-k / top-p sampler (what engines fall back to)."""
    logits = x / temperature
    vals, idx = logits.sort(dim=1, descending=True)
    vals[:, top_k:] = float("-inf")
    probs = vals.softmax(dim=1)
    drop = probs.cumsum(dim=1) - probs > top_p
    vals = vals.masked_fill(drop, float("-inf"))
    choice = torch.multinomial(vals.softmax(dim=1), 1)
    return idx.gather(1, choice)


FIRST_SIZE_ONLY = ("topk_topp_pen",)


def _warm_up(case: Case, rows: int, vocab: int, calls: int = 50) -> None:
    """Untimed calls before the first case (GPU clocks, host caches, allocator): otherwise the
    first case measured pays them (seen as 2 x its later host time)."""
    x = torch.randn(rows, vocab, device="cuda")
    s, ids = case_sampler(case, rows, vocab, x.device)
    for _ in range(calls):
        s.sample(x, s.plan(ids)).token_lists()
        x.argmax(dim=1).tolist()
    del s, x
    torch.cuda.empty_cache()


def run(rows_list=(32, 256, 1024), vocab: int = 151936, iters: int = 20, progress=None, cases=None) -> list[dict]:
    """cases: the names to run (all when None). Every wall time is measured before the first
    profiled call (phase "wall", then phase "device" over the same logits): a finished profiler
    session can leave host work behind on later CUDA calls."""
    chosen = [c for c in CASES if cases is None or c.name in cases]
    _warm_up(chosen[0], rows_list[0], vocab)
    plan = [(case, rows) for rows in rows_list for case in chosen
            if rows == rows_list[0] or case.name not in FIRST_SIZE_ONLY]
    merged: dict = {}
    for j, phase in enumerate(("wall", "device")):
        for i, (case, rows) in enumerate(plan):
            if progress is not None:
                progress(j * len(plan) + i, 2 * len(plan), f"{phase}: {case.name} x {rows}")
            x = torch.randn(rows, vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(rows)) * 3
            base = {"case": case.name, "rows": rows, "vocab": vocab}
            found = _tpsample(case, x, iters, phase)
            found += [r for r in (_anchor(name, case, x, iters, phase) for name in case.anchors) if r is not None]
            for r in found:
                merged.setdefault((case.name, rows, r["impl"]), dict(base)).update(r)
            del x
            torch.cuda.empty_cache()
    return list(merged.values())


def main(args) -> None:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table
    if not torch.cuda.is_available():
        raise ValueError("bench sampler --compare needs a CUDA device")
    with Progress(transient=True) as bar:
        task = bar.add_task("compare", total=None)
        results = run(tuple(args.rows) if args.rows else (32, 256, 1024), args.vocab[0] if args.vocab else 151936,
                      iters=max(5, args.steps), cases=getattr(args, "cases", None),
                      progress=lambda i, n, what: bar.update(task, completed=i, total=n, description=what))
    table = Table(title="one sampling call as an engine sees it (H2D + kernels + tokens on host)")
    for col in ("case", "rows", "impl", "wall us", "device us", "host us", "extra MiB"):
        table.add_column(col, justify="right", no_wrap=col in ("case", "impl"))
    for r in results:
        table.add_row(r["case"], str(r["rows"]), r["impl"], f"{r['wall_us']:.0f}", f"{r['device_us']:.0f}",
                      f"{r['host_us']:.0f}", f"{r['extra_mib']:.2f}")
    Console().print(table)
    if getattr(args, "plot", None):
        from .plots import plot_compare

        plot_compare(results, args.plot, title=f"one sampling call until the tokens are on the host (median wall "
                                               f"time), vocab {results[0]['vocab']:,}, {torch.cuda.get_device_name()}")
        print(f"plot: {args.plot}")
    print(json.dumps({"bench": "sampler_compare", "device": torch.cuda.get_device_name(), "results": results}))
