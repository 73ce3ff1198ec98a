"""`tpsample demo`, sampler part: one mixed batch under every strategy at TP ranks.

Shows, per strategy: whether its tokens equal the TP=1 sampler's, the per-rank sampler peak
memory, bytes moved per rank and collectives per step. The engine part (real chat answers at
TP=1 and TP=3) lives in `demo.engine` and runs after this; `closing_sentence` sums up both.
"""
from __future__ import annotations

import torch

from ..parallel import names
from ..params import SamplingParams

DEMO_VOCAB = 151_936
STRATEGIES = names.REPORT_ORDER


def demo_params(vocab: int) -> list[tuple[str, SamplingParams]]:
    return [
        ("greedy", SamplingParams(temperature=0.0)),
        ("top-k 50 + top-p 0.9, T 0.8", SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=1, logprobs=3)),
        ("min-p 0.05", SamplingParams(temperature=1.0, min_p=0.05, seed=2)),
        ("penalties", SamplingParams(temperature=0.7, repetition_penalty=1.3, frequency_penalty=0.5,
                                     presence_penalty=0.3, seed=3)),
        ("top-p 0.95, processed logprobs", SamplingParams(top_p=0.95, seed=4, logprobs=2, logprobs_mode="processed")),
        ("bias + allowed ids", SamplingParams(seed=5, logit_bias={42: 5.0}, allowed_token_ids=[7, 42, 4242, vocab - 1])),
    ]


def _logits(step: int, rows: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(rows, vocab, generator=g) * 3


def run_batch(group, strategy: str, vocab: int = DEMO_VOCAB, steps: int = 3, device: str = "cpu"):
    """Tokens per step and the last step's stats for the demo batch."""
    import tpsample
    s = tpsample.Sampler(vocab, max_num_reqs=16, strategy=strategy, group=group, seed=7, device=device)
    start, end = tpsample.vocab_shard(vocab, s.tp_size, s.rank)
    names = [n for n, _ in demo_params(vocab)]
    for n, p in demo_params(vocab):
        s.add_request(n, p, [1, 2, 3])
    tokens = []
    for step in range(steps):
        plan = s.plan(names)
        full = _logits(step, plan.num_rows, vocab)
        local = full[plan.logits_order][:, start:end].contiguous().to(device)
        out = s.sample(local, plan)
        tokens.append(out.sampled_token_ids[:, 0].tolist())
    return {"tokens": tokens, "stats": s.last_stats}


def _all_strategies(group, vocab, steps, device):
    return {st: run_batch(group, st, vocab, steps, device) for st in STRATEGIES}


def run_sampler_demo(tp: int = 2, device: str = "cpu", vocab: int = DEMO_VOCAB) -> dict:
    from ..parallel.launch import spawn_ranks
    from ..term import console as make_console
    from ..term import table as make_table
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    console = make_console()
    console.print(f"[bold]tpsample demo[/bold]: {len(demo_params(vocab))} requests "
                  f"({', '.join(n for n, _ in demo_params(vocab))}), vocab {vocab:,}, TP={tp} on {device} (gloo)")
    with console.status(f"sampling 3 steps under every strategy at TP={tp}"):
        ref = run_batch(None, "replicated", vocab, device=device)
        per_rank = spawn_ranks(_all_strategies, tp, vocab, 3, device, timeout_s=600) if tp > 1 else [
            _all_strategies(None, vocab, 3, device)]
    table = make_table(f"sampling strategies at TP={tp} (last step)",
                       ["strategy", "tokens ==\nTP=1", "peak\nMiB/rank", "shard\nMiB", "KiB moved\n/rank",
                        "collec-\ntives"], left=("strategy",))
    summary = {}
    for st in STRATEGIES:
        same = all(r[st]["tokens"] == ref["tokens"] for r in per_rank)
        stats = [r[st]["stats"] for r in per_rank]
        peak = max(x.peak_bytes for x in stats)
        moved = max(x.bytes_sent + x.bytes_received for x in stats)
        name = st if st != "auto" else f"auto -> {stats[0].strategy}"
        table.add_row(name, "yes" if same else "NO", f"{peak / 2**20:.2f}", f"{stats[0].local_logits_bytes / 2**20:.2f}",
                      f"{moved / 1024:.1f}", str(stats[0].num_collectives))
        summary[st] = {"identical": same, "peak_bytes": peak, "bytes_moved": moved}
    console.print(table)
    return summary


def closing_sentence(sampler: dict | None, engine: dict | None, tp: int) -> str:
    """One plain sentence saying what the demo showed."""
    parts = []
    if sampler:
        same = all(v["identical"] for v in sampler.values())
        mem = ", ".join(f"{k} {v['peak_bytes'] / 2**20:.1f} MiB" for k, v in sampler.items())
        parts.append(f"{'every' if same else 'NOT every'} strategy sampled the same tokens at TP={tp} as at "
                     f"TP=1 on a {DEMO_VOCAB:,}-token vocabulary (sampler peak per rank: {mem})")
    if engine:
        mem = ", ".join(f"{k} {v:.1f} MiB" for k, v in engine["peak_mib_per_rank"].items())
        sizes = " and ".join(f"TP={t}" for t in engine["tp_sizes"])
        parts.append(f"{engine['model']} wrote {'identical' if engine['identical'] else 'DIFFERENT'} chat answers "
                     f"({engine['num_tokens']} tokens) at {sizes} under every strategy (sampling memory per rank "
                     f"at TP={engine['tp_sizes'][-1]}: {mem})")
    return ("The demo showed that " + "; and ".join(parts) + ".") if parts else ""
