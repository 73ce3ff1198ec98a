"""Speculative decoding under vocab_parallel's rounds: one-hot drafts and draft distributions
are verified inside the rounds (drafts.py), bitwise like the full row, in at most 3 collectives
a step (plus the logprob round and the exact top-p path when those run)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scenarios import step_logits
from test_property_vocab_split import _batch, assert_same_rows, params_strategy, run_split_rounds

from tpsample import Sampler, SamplingParams, vocab_shard
from tpsample.parallel.launch import spawn_ranks
from tpsample.sampling.recipe import SampleArgs
from tpsample.sampling.recipe import sample_rows as _recipe
from tpsample.sampling.reducer import LocalRows
from tpsample.sampling.rounds.drafts import handles
from tpsample.sampling.torch_backend import TORCH


def _drafts(x: torch.Tensor, g: torch.Generator) -> np.ndarray:
    """A draft per row for most rows: the row's argmax (often accepted) or a random token."""
    n, vocab = x.shape
    rand = torch.randint(0, vocab, (n,), generator=g)
    pick = torch.rand(n, generator=g)
    d = torch.where(pick < 0.4, x.nan_to_num(float("-inf")).argmax(dim=1), rand)
    return torch.where(pick > 0.85, -1, d).numpy().astype(np.int64)


def _draft_probs(x: torch.Tensor, drafts: np.ndarray, g: torch.Generator, one_hot: bool) -> torch.Tensor:
    """Draft distributions (a softmax of other logits); with one_hot, every other row one-hot at its draft."""
    q = torch.softmax(torch.randn(x.shape, generator=g) * 2, dim=1)
    if one_hot:
        for i in range(0, x.shape[0], 2):
            if drafts[i] >= 0:
                q[i] = 0
                q[i, drafts[i]] = 1
    return q


@settings(max_examples=120, deadline=None)
@given(vocab=st.integers(3, 300), tp=st.integers(2, 4), params=st.lists(params_strategy, min_size=1, max_size=6),
       data_seed=st.integers(0, 10**6), probs=st.booleans(), one_hot=st.booleans(), holes=st.booleans())
def test_split_rounds_verify_drafts_like_the_full_row(vocab, tp, params, data_seed, probs, one_hot, holes):
    tp = min(tp, vocab)
    g = torch.Generator().manual_seed(data_seed)
    x = torch.randn(len(params), vocab, generator=g) * 3
    if holes:
        x[torch.rand(x.shape, generator=g) < 0.3] = float("-inf")
    drafts = _drafts(x, g)
    q = _draft_probs(x, drafts, g, one_hot) if probs else None
    batch = _batch(params, vocab, drafts)
    assume(handles(batch.host, probs))
    full = _recipe(SampleArgs(x, 0, batch, LocalRows(), draft_probs=q), backend=TORCH)
    parts, calls = run_split_rounds(x, batch, tp, q=q)
    for part in parts:
        assert_same_rows(part, full)
        assert torch.equal(part.accepted.bool(), full.accepted.bool())
    exact = parts[0].exact_rows
    logprobs = batch.logprobs_max >= 0
    assert calls[0] <= 3 + logprobs + (5 if exact else 0), calls


V = 2003
REQS = 6
NUM_DRAFTS = 2


def _params(i: int, probs: bool) -> SamplingParams:
    if not probs:          # the bench's drafts class: top-k + top-p, one-hot drafts
        return SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=30 + i)
    return [SamplingParams(temperature=0.9, seed=30 + i), SamplingParams(temperature=0.8, top_k=40, seed=30 + i),
            SamplingParams(temperature=1.0, min_p=0.05, seed=30 + i), SamplingParams(temperature=0.0),
            SamplingParams(temperature=0.7, top_k=20, top_p=0.8, seed=30 + i)][i % 5]


def _spec_steps(group, probs: bool, steps: int = 3):
    """Per step: (tokens per request, rejected per request, collectives) with NUM_DRAFTS drafts a request."""
    s = Sampler(V, max_num_reqs=REQS, max_num_logits_per_req=1 + NUM_DRAFTS, group=group, seed=5,
                strategy="replicated" if group is None else "vocab_parallel")
    start, end = vocab_shard(V, s.tp_size, s.rank)
    ids = [f"d{i}" for i in range(REQS)]
    for i, r in enumerate(ids):
        s.add_request(r, _params(i, probs), [1, 2])
    out = []
    for step in range(steps):
        full = step_logits(3, step, REQS * (1 + NUM_DRAFTS), V)
        drafts = [[int(full[i * (1 + NUM_DRAFTS) + j].argmax()) if (i + j + step) % 3 else (7 * i + j) % V
                   for j in range(NUM_DRAFTS)] for i in range(REQS)]
        plan = s.plan(ids, draft_token_ids=drafts)
        q = torch.softmax(step_logits(4, step, full.shape[0], V), dim=1) if probs else None
        q = None if q is None else q[plan.logits_order][:, start:end].contiguous()
        o = s.sample(full[plan.logits_order][:, start:end].contiguous(), plan, draft_probs=q)
        out.append(([o.tokens(i) for i in range(REQS)], o.num_rejected.tolist(), s.last_stats.num_collectives))
    return out


@pytest.mark.parametrize("probs", [False, True], ids=["one_hot", "draft_probs"])
def test_drafts_take_at_most_three_collectives_and_give_tp1_tokens(probs):
    want = _spec_steps(None, probs)
    assert any(sum(r) for _, r, _ in want) and any(len(t) > 1 for ts, _, _ in want for t in ts)   # both ways
    for tp in (2, 3):
        for rank, steps in enumerate(spawn_ranks(_spec_steps, tp, probs, timeout_s=600)):
            for step, ((tokens, rejected, colls), (w_tokens, w_rejected, _)) in enumerate(zip(steps, want)):
                assert tokens == w_tokens and rejected == w_rejected, (tp, rank, step)
                assert colls <= (3 if probs else 2), (tp, rank, step, colls)
