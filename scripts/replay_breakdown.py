"""Where the wall time of a replayed step goes (CUDA): per case of `bench sampler --compare`, the
median host us of each part of `CapturedStep.replay()` and of reading the tokens, next to the
same measure for a graph holding one small kernel and the same device-to-host copy (the floor of
a graph launch + event + read); then, from a torch profiler trace, the device timeline of one
replay: first kernel start after the graph launch call, the busy span, the kernels' own time and
the gaps between them; and the first two figures again once the profiler has run.
    python scripts/replay_breakdown.py [rows [case ...]]
With WITH_FI=1, FlashInfer's sampling op runs once on the same logits first (is a process that
loaded it slower?). Each case also gets the compare bench's own wall measure of the replay
(`compare_wall`).
Prints a table per case and ends with one JSON line."""
import json
import os
import statistics
import sys
import time

import torch

from tpsample.bench.compare import CASES, _wall_us, case_sampler


def parts_of_replay(step, n=40):
    """Median us of guard, release, graph launch, publish, bookkeeping, and the token read."""
    names = ("guard", "release", "graph.replay", "publish", "note_step", "token_lists", "logprobs", "total")
    acc = {k: [] for k in names}
    for _ in range(n):
        torch.cuda.synchronize()
        t = [time.perf_counter()]
        step._guard.check()
        t.append(time.perf_counter())
        step._results.release()
        t.append(time.perf_counter())
        step.graph.replay()
        t.append(time.perf_counter())
        out = step._results.publish()
        t.append(time.perf_counter())
        step.sampler.store.history.note_step(step.plan.slots, step.plan.rows_per_req)
        t.append(time.perf_counter())
        out.token_lists()
        t.append(time.perf_counter())
        _ = out.logprobs
        t.append(time.perf_counter())
        for k, a, b in zip(names, t, t[1:]):
            acc[k].append((b - a) * 1e6)
        acc["total"].append((t[-1] - t[0]) * 1e6)
    return {k: round(statistics.median(v), 1) for k, v in acc.items()}


def null_graph(rows, n=40):
    """A graph of one small kernel and a D2H copy of `rows` int64 into pinned memory."""
    a = torch.zeros(rows, dtype=torch.int64, device="cuda")
    host = torch.empty(rows, dtype=torch.int64, pin_memory=True)
    ev = torch.cuda.Event()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        a.add_(1)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        a.add_(1)
        host.copy_(a, non_blocking=True)
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        ev.record()
        ev.synchronize()
        host.tolist()
        out.append((time.perf_counter() - t0) * 1e6)
    return round(statistics.median(out), 1)


def eager_argmax(rows, n=40):
    """Median us of an eager `argmax(dim=1).tolist()` of [rows, 151,936] (a host-bound anchor)."""
    x = torch.randn(rows, 151936, device="cuda")
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x.argmax(dim=1).tolist()
        out.append((time.perf_counter() - t0) * 1e6)
    return round(statistics.median(out), 1)


def timeline(fn, n=5):
    """Per replay (median over n): us from the graph launch call to the first device op, the busy
    span, the device ops' own time and the gaps between them."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
            torch.cuda.synchronize()
    ev = prof.events()
    launches = sorted(e.time_range.start for e in ev if e.name == "cudaGraphLaunch")
    dev = sorted((e.time_range.start, e.time_range.end, e.name) for e in ev
                 if e.device_type == torch.autograd.DeviceType.CUDA)
    rows = []
    for i, t0 in enumerate(launches):
        t1 = launches[i + 1] if i + 1 < len(launches) else float("inf")
        ops = [d for d in dev if t0 <= d[0] < t1]
        if not ops:
            continue
        own = sum(b - a for a, b, _ in ops)
        span = ops[-1][1] - ops[0][0]
        rows.append({"first_op_after_launch": ops[0][0] - t0, "span": span, "own": own, "gaps": span - own,
                     "ops": len(ops)})
    if not rows:
        return {}
    return {k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]}


def main():
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    wanted = set(sys.argv[2:]) or {"greedy", "temperature", "topk_topp", "topp"}
    vocab = 151936
    x = torch.randn(rows, vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(rows)) * 3
    if os.environ.get("WITH_FI") == "1":
        import flashinfer.sampling as fs
        fs.sampling_from_logits(x / 0.8).tolist()
        print("flashinfer loaded and run once")
    floor, anchor = null_graph(rows), eager_argmax(rows)
    print(f"null graph (one kernel + D2H copy + event + read): {floor} us; eager argmax().tolist(): {anchor} us")
    res = {"rows": rows, "null_graph_us": floor, "argmax_us": anchor, "cases": {}}
    for case in CASES:
        if case.name not in wanted:
            continue
        s, ids = case_sampler(case, rows, vocab, x.device)
        step = s.capture(s.plan(ids), x, reserve_tokens=600)
        for _ in range(5):
            step.replay().token_lists()
        parts = parts_of_replay(step)

        def replay(step=step):
            out = step.replay()
            return lambda: (out.token_lists(), out.logprobs)
        parts["compare_wall"] = round(_wall_us(replay, 21)[0], 1)
        tl_ = timeline(lambda step=step: step.replay().token_lists())
        res["cases"][case.name] = {"host": parts, "device": tl_}
        print(f"=== {case.name} ({rows} rows)")
        print("  host us: " + ", ".join(f"{k} {v}" for k, v in parts.items()))
        print("  device us: " + ", ".join(f"{k} {v}" for k, v in tl_.items()))
        sys.stdout.flush()
    # the same two after the profiler ran: does a finished profiler session leave host cost behind?
    res["after_profiler"] = {"null_graph_us": null_graph(rows), "argmax_us": eager_argmax(rows)}
    print(f"after the profiler: {res['after_profiler']}")
    print(json.dumps({"bench": "replay_breakdown", **res}))


if __name__ == "__main__":
    main()
