"""Cases run inside gloo ranks for test_vocab_rounds.py (one process group for all of them).

Full logits are a pure function of (seed, step), so the TP=1 reference in the test process and
every rank see the same numbers.
"""
from __future__ import annotations

import numpy as np
import torch
from scenarios import step_logits

import tpsample
from tpsample import SamplingParams

V = 4099               # prime: every split is uneven
ROWS = 12


def _mix(i: int, **kw) -> SamplingParams:
    return SamplingParams(seed=100 + i, **kw)


WORKLOADS = {
    "greedy": lambda i: SamplingParams(temperature=0.0),
    "temperature": lambda i: _mix(i, temperature=0.8),
    "top_k": lambda i: _mix(i, temperature=0.8, top_k=40),
    "top_k_top_p": lambda i: _mix(i, temperature=0.8, top_k=50, top_p=0.9),
    "min_p": lambda i: _mix(i, temperature=1.0, min_p=0.05),
    "top_k_min_p": lambda i: _mix(i, temperature=1.0, top_k=20, min_p=0.1),
    "top_p": lambda i: _mix(i, temperature=0.8, top_p=0.9),
    "top_p_min_p": lambda i: _mix(i, temperature=1.0, top_p=0.95, min_p=0.01),
    "mixed": lambda i: [SamplingParams(temperature=0.0), _mix(i, temperature=0.7, top_k=5),
                        _mix(i, temperature=1.0, top_p=0.8), _mix(i, temperature=1.2, min_p=0.02, top_p=0.7),
                        _mix(i, temperature=0.9, top_k=30, top_p=0.5)][i % 5],
    "top_k_top_p+logprobs": lambda i: _mix(i, temperature=0.8, top_k=50, top_p=0.9, logprobs=5 if i % 4 == 0 else None),
    "top_p+logprobs": lambda i: _mix(i, temperature=0.8, top_p=0.9, logprobs=3),
    "top_p+processed": lambda i: _mix(i, temperature=0.8, top_p=0.6, logprobs=5, logprobs_mode="processed"),
    "mixed+processed": lambda i: _mix(i, temperature=0.0 if i % 3 == 0 else 0.9, top_k=10 if i % 2 else -1,
                                      logprobs=2, logprobs_mode="processed"),
}
# workloads whose step reads nothing back to the host: vocab_parallel (every filter but top-p
# without top-k) and batch_sharded (its CPU full-row pipeline reads for top-p; on CUDA the kernels
# run those rows)
NO_HOST_READ = {"vocab_parallel": ("greedy", "temperature", "top_k", "top_k_top_p", "min_p", "top_k_min_p",
                                   "top_k_top_p+logprobs", "mixed+processed"),
                "batch_sharded": ("greedy", "temperature", "top_k", "min_p", "mixed+processed")}


def run_workload(group, name: str, strategy: str = "vocab_parallel", steps: int = 2):
    """Tokens, logprobs and step stats of a workload (two steps, the second with the same plan)."""
    s = tpsample.Sampler(V, max_num_reqs=ROWS, strategy=strategy, group=group, seed=9)
    start, end = tpsample.vocab_shard(V, s.tp_size, s.rank)
    ids = [f"q{i}" for i in range(ROWS)]
    for i, r in enumerate(ids):
        s.add_request(r, WORKLOADS[name](i), [1, 2, 3])
    out = []
    for step in range(steps):
        plan = s.plan(ids)
        local = step_logits(77, step, ROWS, V)[:, start:end].contiguous()
        o = s.sample(local, plan)
        lp = None if o.logprobs is None else (o.logprobs.token_ids.tolist(), o.logprobs.logprobs.tolist(),
                                                 o.logprobs.ranks.tolist())
        st = s.last_stats
        out.append({"tokens": o.sampled_token_ids[:, 0].tolist(), "lp": lp, "rounds": st.num_rounds,
                    "exact_rows": st.exact_rows, "bytes": st.bytes_received})
    return out


def host_reads(group, name: str, strategy: str) -> list[str]:
    """The host reads of a step whose plan is already agreed (the second step of a workload).

    The per-step plan check is off here: it all-gathers a fingerprint over the host (gloo) twin
    group and reads that host tensor, which never touches the device stream."""
    from host_reads import count_host_reads
    s = tpsample.Sampler(V, max_num_reqs=ROWS, strategy=strategy, group=group, seed=9, check_plans=False)
    start, end = tpsample.vocab_shard(V, s.tp_size, s.rank)
    ids = [f"q{i}" for i in range(ROWS)]
    for i, r in enumerate(ids):
        s.add_request(r, WORKLOADS[name](i), [1, 2, 3])
    local = step_logits(77, 0, ROWS, V)[:, start:end].contiguous()
    s.sample(local, s.plan(ids))
    plan = s.plan(ids)
    with count_host_reads() as calls:
        s.sample(local, plan)
    return list(calls)


def forced_exact(group):
    """The exact top-p path forced for every band row, through real collectives."""
    from tpsample.parallel.collectives import Collectives
    from tpsample.parallel.group import TPGroup
    from tpsample.parallel.strategies import ShardReducer
    from tpsample.sampling.processors import PROCESSORS
    from tpsample.sampling.recipe import SampleArgs, sample_rows
    from tpsample.sampling.rounds.rounds import ROUNDS_EXACT
    from tpsample.state.rows import RowsView
    from tpsample.state.store import RequestStore
    g = TPGroup.resolve(group)
    start, end = tpsample.vocab_shard(V, g.size, g.rank)
    store = RequestStore(V, ROWS, None, PROCESSORS)
    for i in range(ROWS):
        p = WORKLOADS["top_p+logprobs"](i)
        store.add(str(i), p, [1, 2], p.seed)
    store.sync(torch.device("cpu"), 1)
    b = store.row_batch(RowsView(np.arange(ROWS), np.zeros(ROWS, np.int64), np.full(ROWS, -1, np.int64)),
                        torch.device("cpu"))
    x = step_logits(5, 0, ROWS, V)[:, start:end].contiguous()
    comm = Collectives(g)
    res = sample_rows(SampleArgs(x, start, b, ShardReducer(comm)), backend=ROUNDS_EXACT)
    return {"tokens": res.emitted.tolist(), "lp": res.lp_ids.tolist(), "ranks": res.lp_ranks.tolist(),
            "exact_rows": res.exact_rows, "collectives": comm.stats.num_collectives}


def auto_grid(group, vocabs=(1000, 32000), rows=(1, 8, 64)):
    """Per shape: auto's choice, after its first use measured the costs it decides from."""
    results, calib = [], []
    for vocab in vocabs:
        n = max(rows)
        auto = tpsample.Sampler(vocab, max_num_reqs=n, strategy="auto", group=group, seed=3)
        ids = [f"a{i}" for i in range(n)]
        start, end = tpsample.vocab_shard(vocab, auto.tp_size, auto.rank)
        for i, r in enumerate(ids):
            auto.add_request(r, SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=i), [1])
        x = step_logits(11, 0, n, vocab)[:, start:end].contiguous()
        auto.sample(x[:1], auto.plan(ids[:1]))                     # first use: measures
        calib.append((vocab, auto.auto.comm, list(auto.auto.steps.values())))
        results.extend({"vocab": vocab, "rows": r, "choice": auto.plan(ids[:r]).strategy} for r in rows)
    return {"grid": results, "calibration": calib}


def all_cases(group):
    out = {"runs": {name: run_workload(group, name) for name in WORKLOADS}}
    cases = [(name, s) for s, names in NO_HOST_READ.items() for name in names] + [("top_p", "vocab_parallel")]
    out["reads"] = {(name, s): host_reads(group, name, s) for name, s in cases}
    out["forced"] = forced_exact(group)
    out["auto"] = auto_grid(group)
    return out
