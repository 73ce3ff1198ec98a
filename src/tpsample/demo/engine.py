"""The engine part of `tpsample demo`: real chat answers at two TP sizes under every strategy.

The model is SmolLM2-135M-Instruct (fetched and converted once, see `default_model`), any
local HF folder, or, offline, a tiny random model. A few chat requests (greedy and seeded
sampling) run through a fresh engine per (TP size, strategy); the demo shows the answers, that
every run produced the same tokens as the first, and each run's sampling memory per rank (the
profile step at max_num_seqs rows). Ranks use one CPU thread each at every TP size, so a shared
machine does not stall and the runs compare like for like.
"""
from __future__ import annotations

import time

from tpsample.model import ModelConfig
from tpsample.parallel import names

STRATEGIES = names.REPORT_ORDER
CHATS = [("What is the capital of France?", dict(temperature=0.0)),
         ("Name three primary colors.", dict(temperature=0.0)),
         ("What is 2 + 2?", dict(temperature=0.0)),
         ("Say hello in Spanish.", dict(temperature=0.8, top_p=0.9, seed=1))]


def demo_tp_sizes(folder: str, limit: int = 4) -> list[int]:
    """1 and the smallest TP size above 1 that splits the model (3 for SmolLM2's 9 / 3 heads)."""
    cfg = ModelConfig.from_folder(folder)
    more = [t for t in range(2, limit + 1) if not cfg.tp_problems(t)]
    return [1] + more[:1]


def run_one(folder: str, tp: int, strategy: str, *, max_tokens: int, device: str | None,
            max_num_seqs: int, cpu_memory_bytes: int) -> dict:
    import tpsample
    from tpsample.llm import LLM

    params = [tpsample.SamplingParams(max_tokens=max_tokens, **kw) for _, kw in CHATS]
    start = time.perf_counter()
    with LLM(folder, tensor_parallel_size=tp, strategy=strategy, device=device, max_num_seqs=max_num_seqs,
             cpu_memory_bytes=cpu_memory_bytes) as llm:
        outs = llm.chat([[{"role": "user", "content": q}] for q, _ in CHATS], params)
        info = llm.info
    return {"tp": tp, "strategy": strategy, "tokens": [o.output_token_ids for o in outs],
            "texts": [o.text.strip() + (" ..." if o.finish_reason == "length" else "") for o in outs],
            "sampler_peak_bytes": list(info.sampler_peak_bytes),
            "kv_tokens": info.kv_tokens, "seconds": time.perf_counter() - start}


def print_results(results: list[dict], what: str, console=None) -> None:
    """The answers (from the first run) and one table row per (TP size, strategy), sized to the terminal."""
    from rich.text import Text

    from tpsample.term import console as make_console
    from tpsample.term import table as make_table

    console = console or make_console()
    first = results[0]
    console.print(f"\n[bold]{what}[/bold] answers (identical in every run below):")
    for (q, kw), text in zip(CHATS, first["texts"]):
        how = "greedy" if not kw.get("temperature") else f"T={kw['temperature']}, seed {kw['seed']}"
        console.print(Text.assemble(("Q", "cyan"), f" ({how}): {q}\n", ("A", "green"), f": {text}"))
    table = make_table("the same chat requests, one engine per row",
                       ["TP", "strategy", "same\ntokens", "sampling\nMiB / rank", "s"], left=("strategy",))
    for r in results:
        peaks = " / ".join(f"{b / 2**20:.1f}" for b in r["sampler_peak_bytes"])
        table.add_row(str(r["tp"]), r["strategy"], "yes" if r["tokens"] == first["tokens"] else "NO", peaks,
                      f"{r['seconds']:.0f}")
    console.print(table)


def run_demo(*, model: str | None = None, tp_sizes: list[int] | None = None, device: str | None = "cpu",
             max_tokens: int = 24, max_num_seqs: int = 16, cpu_memory_bytes: int = 1 << 30, console=None) -> dict:
    """Run every (TP size, strategy); print answers and table; return a summary."""
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tpsample.engine.default_model import resolve_model
    from tpsample.term import quiet_third_party

    console = console or Console()
    quiet_third_party()
    folder, what = resolve_model(model, console)
    sizes = tp_sizes or demo_tp_sizes(folder)
    config = ModelConfig.from_folder(folder)
    for tp in sizes:
        config.check_tensor_parallel(tp)
    runs = [(tp, s) for tp in sizes for s in STRATEGIES]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    results = []
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("engine", total=len(runs))
            for tp, strategy in runs:
                bar.update(task, description=f"engine: {what}, TP={tp}, {strategy}")
                results.append(run_one(folder, tp, strategy, max_tokens=max_tokens, device=device,
                                       max_num_seqs=max_num_seqs, cpu_memory_bytes=cpu_memory_bytes))
                bar.advance(task)
    finally:
        torch.set_num_threads(threads)
    print_results(results, what, console)
    last_tp = sizes[-1]
    return {"model": what, "tp_sizes": sizes, "identical": all(r["tokens"] == results[0]["tokens"] for r in results),
            "num_tokens": sum(len(t) for t in results[0]["tokens"]),
            "peak_mib_per_rank": {r["strategy"]: max(r["sampler_peak_bytes"]) / 2**20
                                  for r in results if r["tp"] == last_tp},
            "runs": results}
