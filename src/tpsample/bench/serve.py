"""`tpsample bench serve`: N concurrent streaming clients for T seconds against localhost.

Each client sends seeded chat requests back to back (streaming, usage included) until the time
is up; requests still running then finish. Reports requests/s, output tokens/s, time to first
token and time per output token percentiles, then checks through /stats that the engine holds
no KV block and no sampler slot any more. Prints a table and ends through `report.finish` (one
JSON line with what produced it; `--out` writes it too).
Without --url the server runs in this process on 127.0.0.1 and a port the OS picks.
"""
from __future__ import annotations

import asyncio
import json
import time

from .report import finish

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain tensor parallelism briefly.",
           "List three fruits.", "Say hello in Spanish.", "What is 12 times 7?", "Name a famous painter.",
           "Give one tip for writing clear code."]


def percentiles(values: list[float], qs=(50, 90, 99)) -> dict[str, float]:
    if not values:
        return {f"p{q}": float("nan") for q in qs}
    v = sorted(values)
    return {f"p{q}": v[min(len(v) - 1, round(q / 100 * (len(v) - 1)))] for q in qs}


async def _one_request(client, url: str, model: str, i: int, max_tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            "max_tokens": max_tokens, "temperature": 0.8, "seed": i, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first, tokens = None, 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return {"error": f"HTTP {r.status_code}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", ())):
                first = time.perf_counter()
    end = time.perf_counter()
    first = first or end
    return {"ttft": first - start, "tpot": (end - first) / max(1, tokens - 1), "tokens": tokens, "end": end}


async def _load(url: str, model: str, clients: int, duration: float, max_tokens: int, progress) -> tuple[list, float]:
    import httpx

    results: list[dict] = []
    start = time.perf_counter()
    deadline = start + duration
    counter = iter(range(10**9))

    async def worker(client):
        while time.perf_counter() < deadline:
            results.append(await _one_request(client, url, model, next(counter), max_tokens))
            progress(len(results), min(duration, time.perf_counter() - start))

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(clients)))
    return results, time.perf_counter() - start


def _leak_check(url: str, timeout_s: float = 60) -> dict:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        s = httpx.get(url + "/stats", timeout=30).json()
        r = s["resources"]
        idle = s["in_flight"] == 0 and r["running"] == 0 and r["waiting"] == 0
        if idle or time.monotonic() > deadline:
            return {"leaked_kv_blocks": r["num_kv_blocks"] - r["free_kv_blocks"],
                    "leaked_sampler_slots": r["sampler_slots_used"], "idle": idle}


def _summary(results: list, elapsed: float, args, leaks: dict) -> dict:
    ok = [r for r in results if "error" not in r]
    return {"clients": args.clients, "duration_s": round(elapsed, 2), "requests": len(ok),
            "errors": len(results) - len(ok), "requests_per_s": len(ok) / elapsed,
            "output_tokens_per_s": sum(r["tokens"] for r in ok) / elapsed,
            "ttft_ms": {k: 1e3 * v for k, v in percentiles([r["ttft"] for r in ok]).items()},
            "tpot_ms": {k: 1e3 * v for k, v in percentiles([r["tpot"] for r in ok]).items()}, **leaks}


def _print_table(s: dict, title: str) -> None:
    from tpsample.term import console as make_console
    from tpsample.term import table as make_table

    console = make_console()
    table = make_table(title, ["ms", "p50", "p90", "p99"], left=("ms",))
    for key, label in (("ttft_ms", "time to first token"), ("tpot_ms", "time per output token")):
        table.add_row(label, *(f"{s[key][p]:.1f}" for p in ("p50", "p90", "p99")))
    console.print(table)
    leaked = s["leaked_kv_blocks"] or s["leaked_sampler_slots"] or not s["idle"]
    console.print(f"{s['requests']} requests ({s['errors']} errors) in {s['duration_s']} s: "
                  f"{s['requests_per_s']:.2f} requests/s, {s['output_tokens_per_s']:.1f} output tokens/s; "
                  + ("LEAKED: " + f"{s['leaked_kv_blocks']} KV blocks, {s['leaked_sampler_slots']} slots"
                     if leaked else "nothing leaked (every KV block and sampler slot free)"))


def _measure(url: str, model: str, args) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[done]} requests"),
                  TimeRemainingColumn(), transient=True) as bar:
        task = bar.add_task(f"{args.clients} clients", total=args.duration, done=0)
        results, elapsed = asyncio.run(_load(url, model, args.clients, args.duration, args.max_tokens,
                                             lambda n, t: bar.update(task, completed=t, done=n)))
    return _summary(results, elapsed, args, _leak_check(url))


def run_bench(args, open_llm=None) -> dict:
    """Against `args.url`, or (without one) a server started here on `open_llm(args, console)`'s
    (llm, model name)."""
    import httpx

    if args.url:
        url = args.url.rstrip("/")
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        summary = _measure(url, model, args)
    else:
        if open_llm is None:
            raise ValueError("--url is required when no engine is given to start a server on")
        from rich.console import Console

        from tpsample.serve.app import build_app
        from tpsample.serve.server import BackgroundServer

        llm, model = open_llm(args, Console(stderr=True))
        try:
            with BackgroundServer(build_app(llm, model_name=model)) as srv:
                url = srv.url
                summary = _measure(url, model, args)
        finally:
            llm.close()
    summary = {"model": model, "tp": getattr(args, "tp", None), "max_tokens": args.max_tokens, **summary}
    _print_table(summary, f"{model}: {args.clients} clients, {args.duration:g} s")
    return finish({"bench": "serve", **summary}, getattr(args, "out", None))
