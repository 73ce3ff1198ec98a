"""Property: the pipeline on any column split of a row gives the full row's tokens bitwise
(and accept decisions, guard flags and logprobs).

Ranks are simulated by threads that meet at a barrier (`ThreadShards`), so hypothesis can fuzz
vocabulary sizes, uneven splits, ties, -inf columns and every filter combination quickly; the
real process-group path is covered by test_tp_strategies.py.
"""
from __future__ import annotations

import threading

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsample import SamplingParams, vocab_shard
from tpsample.sampling.recipe import SampleArgs
from tpsample.sampling.recipe import sample_rows as _recipe
from tpsample.sampling.torch_backend import TORCH
from tpsample.sampling.reducer import LocalRows, best_of_parts
from tpsample.state.rows import RowsView
from tpsample.state.store import RequestStore
from tpsample.sampling.processors import PROCESSORS


class ThreadShards:
    """A reducer for one simulated rank; ranks exchange tensors through shared slots."""

    def __init__(self, shared: dict, rank: int, size: int):
        self.shared, self.rank, self.num_parts = shared, rank, size

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        slots, barrier = self.shared["slots"], self.shared["barrier"]
        slots[self.rank] = x.clone()
        barrier.wait()
        parts = list(slots)
        barrier.wait()
        return parts

    def max(self, x):
        return torch.stack(self._exchange(x)).amax(dim=0)

    def sum(self, x):
        return torch.stack(self._exchange(x)).sum(dim=0)

    def gather(self, x):
        return torch.stack(self._exchange(x), dim=1)

    def argmax_pair(self, values, ids):
        packed = self.gather(torch.stack([values.double(), ids.double()], dim=1))
        return best_of_parts(packed[:, :, 0].to(values.dtype), packed[:, :, 1].to(torch.int64))


def run_split(x: torch.Tensor, batch, tp: int):
    vocab = x.shape[1]
    shared = {"slots": [None] * tp, "barrier": threading.Barrier(tp, timeout=60)}
    results, errors = [None] * tp, []

    def rank_main(r):
        try:
            s, e = vocab_shard(vocab, tp, r)
            results[r] = _recipe(SampleArgs(x[:, s:e].contiguous(), s, batch, ThreadShards(shared, r, tp)), backend=TORCH)
        except BaseException as exc:   # surface errors from the thread
            errors.append(exc)
            shared["barrier"].abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


params_strategy = st.builds(
    lambda t, k, p, mp, seed, lp, rep, bias: SamplingParams(
        temperature=t, top_k=k, top_p=p, min_p=mp, seed=seed, logprobs=lp,
        logprobs_mode="processed" if seed % 2 else "raw", repetition_penalty=rep,
        logit_bias={1: bias} if bias else None, bad_words_token_ids=[[2]] if seed % 3 == 0 else None),
    t=st.sampled_from([0.0, 0.5, 1.0, 1.7]), k=st.sampled_from([-1, 1, 2, 5, 40]),
    p=st.sampled_from([1.0, 0.95, 0.6, 0.1]), mp=st.sampled_from([0.0, 0.02, 0.3]),
    seed=st.integers(0, 2**40), lp=st.sampled_from([None, 0, 3]), rep=st.sampled_from([1.0, 1.5]),
    bias=st.sampled_from([0.0, 5.0, -3.0]))


@settings(max_examples=200, deadline=None)
@given(vocab=st.integers(3, 260), tp=st.integers(2, 5), params=st.lists(params_strategy, min_size=1, max_size=5),
       data_seed=st.integers(0, 10**6), ties=st.booleans(), holes=st.booleans(), drafts=st.booleans())
def test_any_column_split_gives_the_full_row_tokens(vocab, tp, params, data_seed, ties, holes, drafts):
    tp = min(tp, vocab)
    g = torch.Generator().manual_seed(data_seed)
    x = torch.randn(len(params), vocab, generator=g) * 3
    if ties:
        x = torch.round(x)                                   # many equal values
    if holes:
        x[torch.rand(x.shape, generator=g) < 0.3] = float("-inf")
    # rows may verify a draft token (spec decode): accept test, residual draw
    draft = [int(d) % vocab if drafts else -1 for d in torch.randint(0, vocab, (len(params),), generator=g)]
    store = RequestStore(vocab, len(params), None, PROCESSORS)
    for i, p in enumerate(params):
        store.add(str(i), p, [1, 2], p.seed or 0)
    store.sync(torch.device("cpu"), 1)
    n = len(params)
    batch = store.row_batch(RowsView(np.arange(n), np.zeros(n, np.int64), np.array(draft, np.int64)),
                            torch.device("cpu"))
    full = _recipe(SampleArgs(x, 0, batch, LocalRows()), backend=TORCH)
    for part in run_split(x, batch, tp):
        assert torch.equal(part.emitted, full.emitted)
        assert torch.equal(part.accepted, full.accepted)
        assert torch.equal(part.fallback, full.fallback)
        if full.lp_ids is not None:
            assert torch.equal(part.lp_ids, full.lp_ids)
            assert torch.equal(part.lp_ranks, full.lp_ranks)
            assert torch.allclose(part.lp_vals, full.lp_vals, atol=1e-5, rtol=0, equal_nan=True)


class CountingShards(ThreadShards):
    """ThreadShards that also counts this rank's collectives (gathers, maxima, sums)."""

    def _exchange(self, x):
        self.shared.setdefault("calls", [0] * self.num_parts)[self.rank] += 1
        return super()._exchange(x)


def run_split_rounds(x: torch.Tensor, batch, tp: int, force_exact: bool = False, q=None):
    """The vocab-parallel rounds on every column part (threads as ranks); (results, collectives
    per rank). q: optional [rows, vocab] draft distributions, split like x."""
    from tpsample.sampling.rounds.rounds import ROUNDS, ROUNDS_EXACT
    vocab = x.shape[1]
    shared = {"slots": [None] * tp, "barrier": threading.Barrier(tp, timeout=60)}
    results, errors = [None] * tp, []

    def rank_main(r):
        try:
            s, e = vocab_shard(vocab, tp, r)
            part_q = None if q is None else q[:, s:e].contiguous()
            results[r] = _recipe(SampleArgs(x[:, s:e].contiguous(), s, batch, CountingShards(shared, r, tp),
                                            draft_probs=part_q), backend=ROUNDS_EXACT if force_exact else ROUNDS)
        except BaseException as exc:   # surface errors from the thread
            errors.append(exc)
            shared["barrier"].abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results, shared.get("calls", [0] * tp)


def _batch(params, vocab, drafts=None):
    store = RequestStore(vocab, len(params), None, PROCESSORS)
    for i, p in enumerate(params):
        store.add(str(i), p, [1, 2], p.seed or 0)
    store.sync(torch.device("cpu"), 1)
    n = len(params)
    draft = np.full(n, -1, np.int64) if drafts is None else np.asarray(drafts, np.int64)
    return store.row_batch(RowsView(np.arange(n), np.zeros(n, np.int64), draft), torch.device("cpu"))


def assert_same_rows(part, full):
    assert torch.equal(part.emitted, full.emitted)
    assert torch.equal(part.fallback, full.fallback)
    assert torch.equal(part.num_nans, full.num_nans)
    if full.lp_ids is not None:
        assert torch.equal(part.lp_ids, full.lp_ids)
        assert torch.equal(part.lp_ranks, full.lp_ranks)
        assert torch.allclose(part.lp_vals, full.lp_vals, atol=1e-5, rtol=0, equal_nan=True)


@settings(max_examples=150, deadline=None)
@given(vocab=st.integers(3, 400), tp=st.integers(2, 5), params=st.lists(params_strategy, min_size=1, max_size=5),
       data_seed=st.integers(0, 10**6), ties=st.booleans(), holes=st.booleans(), nans=st.booleans(),
       force_exact=st.booleans())
def test_split_rounds_give_the_full_row_tokens(vocab, tp, params, data_seed, ties, holes, nans, force_exact):
    """The vocab-parallel round pipeline on any column split equals the full-row pipeline bitwise,
    in at most 3 gathers (summary, winners, logprobs) unless the exact top-p path runs."""
    tp = min(tp, vocab)
    g = torch.Generator().manual_seed(data_seed)
    x = torch.randn(len(params), vocab, generator=g) * 3
    if ties:
        x = torch.round(x)
    if holes:
        x[torch.rand(x.shape, generator=g) < 0.3] = float("-inf")
    if nans:
        x[torch.rand(x.shape, generator=g) < 0.05] = float("nan")
    batch = _batch(params, vocab)
    full = _recipe(SampleArgs(x, 0, batch, LocalRows()), backend=TORCH)
    parts, calls = run_split_rounds(x, batch, tp, force_exact)
    for part in parts:
        assert_same_rows(part, full)
    exact = parts[0].exact_rows
    assert all(p.exact_rows == exact for p in parts)
    assert calls[0] <= 3 + (5 if exact else 0)


def test_split_top_p_counts_ties_beyond_the_candidates():
    """top-k + top-p where the k-th value ties with far more tokens than any part sends: the
    unseen ties carry most of the kept mass, so top-p must count them (a part sends k + 1 values)."""
    vocab, n = 200, 16
    x = torch.full((n, vocab), -5.0)
    x[:, 0] = 2.0
    x[:, 1:100] = 0.0                                    # 99 ties at the 3rd value
    params = [SamplingParams(temperature=1.0, top_k=3, top_p=0.5, seed=i) for i in range(n)]
    batch = _batch(params, vocab)
    full = _recipe(SampleArgs(x, 0, batch, LocalRows()), backend=TORCH)
    assert (full.emitted != 0).sum() > n // 2           # the ties are kept, and usually drawn
    for tp in (2, 3):
        parts, calls = run_split_rounds(x, batch, tp)
        for part in parts:
            assert_same_rows(part, full)
        assert calls[0] == 2


def test_split_top_p_undecided_crossing_takes_the_exact_path():
    """Two tokens 0.0005 apart share the sub-bin where top-p crosses: the upper one is kept, the
    lower one dropped. When the lower one has the better draw score the row cannot be decided from
    the round-2 summaries; it must take the exact path and still emit the upper one (or another
    kept token), exactly as the full row does."""
    vocab, n = 64, 24
    x = torch.full((n, vocab), -30.0)
    x[:, 10] = 0.05
    x[:, 40] = 0.0495                   # the other part at TP = 2; one 1/256-nat sub-bin holds both
    params = [SamplingParams(temperature=1.0, top_p=0.5, seed=1000 + i) for i in range(n)]
    batch = _batch(params, vocab)
    full = _recipe(SampleArgs(x, 0, batch, LocalRows()), backend=TORCH)
    assert (full.emitted == 10).all()                    # only the upper token is kept
    parts, _ = run_split_rounds(x, batch, 2)
    for part in parts:
        assert_same_rows(part, full)
    # about half the seeds put the dropped token ahead in the draw: those rows went exact
    assert 0 < parts[0].exact_rows < n
