"""Shared test scenarios: mixed batches run through a Sampler on any TP size and strategy.

Full logits are a pure function of (seed, step), so every rank and every TP size sees the same
numbers; each rank slices its vocab shard and the rows in the plan's logits order.
"""
from __future__ import annotations

import os

import torch

import tpsample
from tpsample import SamplingParams

V_ODD = 997            # neither 2, 3, 4 nor 32 divides it
# TPSAMPLE_TEST_DEVICE=cuda runs the same scenarios on CUDA tensors (several gloo ranks may
# share one GPU); the default is CPU.
DEVICE = os.environ.get("TPSAMPLE_TEST_DEVICE", "cpu")


def mixed_params(vocab: int) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=11, logprobs=3),
        SamplingParams(temperature=1.0, min_p=0.05, seed=12, logprobs=2, logprobs_mode="processed"),
        SamplingParams(temperature=0.7, top_p=0.6, seed=13, repetition_penalty=1.3,
                       frequency_penalty=0.4, presence_penalty=0.2),
        SamplingParams(temperature=1.2, seed=14, logit_bias={3: 4.0, vocab - 1: 3.0}, min_tokens=2,
                       stop_token_ids=[5, 6]),
        SamplingParams(temperature=0.9, seed=15, allowed_token_ids=[1, 2, 3, vocab // 2, vocab - 2]),
        SamplingParams(temperature=1.0, seed=16, bad_words_token_ids=[[7], [1, 2, 9]], top_k=5),
        SamplingParams(temperature=0.0, logprobs=4, repetition_penalty=1.5),
        SamplingParams(temperature=1.0, top_p=0.95, top_k=300, min_p=0.01, seed=17, logprobs=1),
    ]


def step_logits(seed: int, step: int, rows: int, vocab: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + step)
    return torch.randn(rows, vocab, generator=g) * scale


def grammar_rows(rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = (vocab + 31) // 32
    bits = torch.randint(0, 2**31 - 1, (rows, words), generator=g, dtype=torch.int64)
    bits |= torch.randint(0, 2**31 - 1, (rows, words), generator=g, dtype=torch.int64) << 1
    bits = torch.where(bits >= 2**31, bits - 2**32, bits)
    mask = bits.to(torch.int32)
    mask[::2] = -1       # every other row unconstrained
    return mask


def run_scenario(group, strategy: str, vocab: int, num_steps: int, order_seed: int = 0,
                 waves: bool = False, grammar: bool = False, drafts: bool = False, probs: bool = False,
                 inplace: bool = False):
    """Run the mixed batch; returns per step (req ids, tokens, num_sampled, logprobs...) in req-id terms."""
    sampler = tpsample.Sampler(vocab, max_num_reqs=16, strategy=strategy, group=group, seed=1234,
                               max_num_logits_per_req=3, eos_token_id=4, device=DEVICE, inplace_logits=inplace)
    tp, rank = sampler.tp_size, sampler.rank
    start, end = tpsample.vocab_shard(vocab, tp, rank)
    params = mixed_params(vocab)
    ids = [f"r{i}" for i in range(len(params))]
    for i, p in enumerate(params):
        sampler.add_request(ids[i], p, [1, 2, 3, i % vocab])
    g = torch.Generator().manual_seed(order_seed)
    results = []
    for step in range(num_steps):
        if waves and step == num_steps // 2:
            for r in ids[::3]:
                sampler.remove_request(r)
            for j, r in enumerate(ids[::3]):
                sampler.add_request(r + "w", SamplingParams(temperature=0.9, seed=40 + j, top_k=7), [9, 8])
            ids = [r for r in ids if r not in ids[::3]] + [r + "w" for r in ids[::3]]
        perm = torch.randperm(len(ids), generator=g).tolist() if order_seed else list(range(len(ids)))
        batch = [ids[i] for i in perm]
        dr = [[(step * 7 + k) % vocab for k in range(i % 3)] for i in range(len(batch))] if drafts else None
        full = _logits_by_request(batch, dr, step, vocab)
        if drafts:   # half the requests draft the argmax of their target rows: many accepts
            start_row = 0
            for i, d in enumerate(dr):
                if i % 2 == 0:
                    d[:] = full[start_row:start_row + len(d)].argmax(dim=1).tolist()
                start_row += 1 + len(d)
        rows = full.shape[0]
        mask = grammar_rows(rows, vocab, step) if grammar else None
        plan = sampler.plan(batch, draft_token_ids=dr, grammar_bitmask=mask)
        local = full[plan.logits_order][:, start:end].contiguous().to(DEVICE)
        q = None
        if probs:   # draft distributions, vocab-sharded and ordered like the logits
            q_full = torch.softmax(_logits_by_request(batch, dr, step + 100, vocab) / 2, dim=1)
            q = q_full[plan.logits_order][:, start:end].contiguous().to(DEVICE)
        out = sampler.sample(local, plan, draft_probs=q)
        rec = {"ids": batch, "tokens": {r: out.tokens(i) for i, r in enumerate(batch)},
               "rejected": {r: int(out.num_rejected[i]) for i, r in enumerate(batch)},
               "nans": {r: int(out.num_nans[i]) for i, r in enumerate(batch)}}
        if out.logprobs is not None:
            lp = out.logprobs
            rec["lp"] = {r: (lp.token_ids[plan.row_start[i]].tolist(), lp.logprobs[plan.row_start[i]].tolist(),
                             int(lp.ranks[plan.row_start[i]])) for i, r in enumerate(batch)}
        rec["stats"] = sampler.last_stats
        results.append(rec)
    return results


def _logits_by_request(batch, drafts, step, vocab):
    """Rows depend only on (request id, row offset, step), never on batch layout."""
    rows = []
    for i, r in enumerate(batch):
        n = 1 + (len(drafts[i]) if drafts else 0)
        seed = sum(ord(c) * 131 ** k for k, c in enumerate(r)) % 100000
        rows.append(step_logits(seed, step, n, vocab))
    return torch.cat(rows, dim=0)


STRATEGIES = ("replicated", "batch_sharded", "vocab_parallel", "auto")


def tp_suite(group, vocab: int = V_ODD, steps: int = 4):
    """Every strategy on the mixed batch (grammar + drafts + logprobs), a permuted-order run, a
    waves run and a draft-probabilities run; a one-request batch (ranks that own nothing); and
    per-strategy accounting on a larger vocabulary. All in one process group, so ranks start
    once per TP size."""
    out = {}
    for s in STRATEGIES:
        out[(s, "mixed")] = run_scenario(group, s, vocab, steps, grammar=True, drafts=True)
        out[(s, "permuted")] = run_scenario(group, s, vocab, steps, order_seed=7)
        out[(s, "waves")] = run_scenario(group, s, vocab, steps, waves=True)
        out[(s, "draft_probs")] = run_scenario(group, s, vocab, steps, drafts=True, probs=True)
        out[(s, "one_request")] = small_batch(group, 301, s)
    out["accounting"] = accounting(group, 40_000, 32)
    return out


def small_batch(group, vocab: int, strategy: str):
    """Fewer requests than ranks: some ranks own nothing but still join every collective."""
    sampler = tpsample.Sampler(vocab, max_num_reqs=8, strategy=strategy, group=group, seed=5)
    start, end = tpsample.vocab_shard(vocab, sampler.tp_size, sampler.rank)
    sampler.add_request("a", SamplingParams(temperature=0.9, top_p=0.8, seed=3, logprobs=2), [1])
    tokens = []
    for step in range(3):
        plan = sampler.plan(["a"])
        full = step_logits(99, step, plan.num_rows, vocab)
        out = sampler.sample(full[plan.logits_order][:, start:end].contiguous().to(DEVICE), plan)
        tokens.append(out.tokens(0) + out.logprobs.token_ids[0].tolist())
    return tokens


def die_mid_step(group, vocab: int):
    """Rank 1 dies before the step's collectives; the others must fail fast with a message."""
    import os
    sampler = tpsample.Sampler(vocab, strategy="vocab_parallel", group=group, seed=1, timeout_s=10)
    start, end = tpsample.vocab_shard(vocab, sampler.tp_size, sampler.rank)
    sampler.add_request("a", SamplingParams(temperature=1.0, top_p=0.9, seed=1), [1])
    plan = sampler.plan(["a"])
    if sampler.rank == 1:
        os._exit(3)
    sampler.sample(step_logits(1, 0, 1, vocab)[:, start:end].contiguous(), plan)
    return "finished"


def accounting(group, vocab: int, rows: int):
    """Per-strategy bytes moved and sampler peak per rank on a larger vocabulary."""
    res = {}
    for s in ("replicated", "batch_sharded", "vocab_parallel"):
        # inplace_logits: the engine's setting (logits are scratch once sampled), so the peaks
        # compare what each strategy adds, not a working copy of the input
        sampler = tpsample.Sampler(vocab, max_num_reqs=rows, strategy=s, group=group, seed=5,
                                   inplace_logits=True)
        start, end = tpsample.vocab_shard(vocab, sampler.tp_size, sampler.rank)
        ids = [f"q{i}" for i in range(rows)]
        for i, r in enumerate(ids):
            sampler.add_request(r, SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=i), [1])
        plan = sampler.plan(ids)
        full = step_logits(3, 0, rows, vocab)
        out = sampler.sample(full[plan.logits_order][:, start:end].contiguous().to(DEVICE), plan)
        res[s] = (out.sampled_token_ids[:, 0].tolist(), sampler.last_stats)
    return res


def kernels_beside_torch(params: list[SamplingParams], x: torch.Tensor):
    """One row per params over the full rows x, on CPU with the kernels switched on (the caller
    sets TPSAMPLE_KERNELS_ON_CPU and the interpreter): (the rows the kernels leave to the torch
    backend, the recipe's result, the torch backend's result alone)."""
    import numpy as np

    from tpsample.sampling.processors import PROCESSORS
    from tpsample.sampling.recipe import SampleArgs, _slow_rows, sample_rows
    from tpsample.sampling.reducer import LocalRows
    from tpsample.sampling.torch_backend import TORCH
    from tpsample.state.rows import RowsView
    from tpsample.state.store import RequestStore
    n, vocab, cpu = len(params), x.shape[1], torch.device("cpu")
    store = RequestStore(vocab, n, None, PROCESSORS)
    for i, p in enumerate(params):
        store.add(str(i), p, [1], p.seed or 0)
    store.sync(cpu, 1)
    b = store.row_batch(RowsView(np.arange(n), np.zeros(n, np.int64), np.full(n, -1, np.int64)), cpu)
    mixed = sample_rows(SampleArgs(x.clone(), 0, b, LocalRows()))
    alone = sample_rows(SampleArgs(x.clone(), 0, b, LocalRows()), backend=TORCH)
    return _slow_rows(b.host).tolist(), mixed, alone


def shard_pass_run(group, vocab: int, workloads: dict, passes: tuple, dtype=torch.float32) -> tuple:
    """Per workload ({name: SamplingParams kwargs}, one request a row) the tokens and logprob
    token ids of 2 steps under vocab_parallel on `group` (TP = 1 replicated without one), and how
    often each named shard kernel (`keys.shard_passes`) ran in this process; "working_copies"
    counts the `front` calls that were given a copy buffer."""
    from tpsample.sampling.keys import _kernel_fns
    shard = _kernel_fns().shard if group is not None else None
    calls: dict = {}
    for name in passes if shard is not None else ():
        def counted(*a, _f=getattr(shard, name), _n=name, **kw):
            calls[_n] = calls.get(_n, 0) + 1
            if _n == "front" and (kw.get("copy") if len(a) < 3 else a[2]) is not None:
                calls["working_copies"] = calls.get("working_copies", 0) + 1
            return _f(*a, **kw)
        setattr(shard, name, counted)
    out = {}
    for name, kwargs in workloads.items():
        rows = 4
        s = tpsample.Sampler(vocab, max_num_reqs=rows, strategy="vocab_parallel" if group else "replicated",
                             group=group, seed=4)
        start, end = tpsample.vocab_shard(vocab, s.tp_size, s.rank)
        ids = [f"r{i}" for i in range(rows)]
        for i, r in enumerate(ids):
            s.add_request(r, SamplingParams(seed=50 + i, **kwargs), [1])
        steps = []
        for step in range(2):
            plan = s.plan(ids)
            x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(step)) * 4
            res = s.sample(x.to(dtype)[plan.logits_order][:, start:end].contiguous(), plan)
            steps.append((res.token_lists(), None if res.logprobs is None else res.logprobs.token_ids.tolist()))
        out[name] = steps
    return out, calls
