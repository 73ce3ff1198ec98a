"""`tpsample.ops` under tensor parallelism on gloo ranks (CPU): every strategy gives every rank
the TP = 1 result bitwise (tokens, logprob ids and ranks; logprob values within 1e-5), drafts
are verified alike, and bad arguments raise on every rank before any collective."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_ops import PARAMS, PROMPT_LENS, V, grammar, logits_at, per_row, special_rows

import tpsample
from tpsample import ops
from tpsample.parallel.launch import spawn_ranks

STRATEGIES = ("replicated", "batch_sharded", "vocab_parallel", "auto")
COUNTS = [2, 0, 1, 2, 1]          # drafts per request of the verify case


def _case(group, strategy: str) -> dict:
    """One rank's (or TP = 1's) results of every call, as lists."""
    tp, rank = (1, 0) if group is None else (dist.get_world_size(group), dist.get_rank(group))
    start, end = tpsample.vocab_shard(V, tp, rank)
    out = {}
    mask = grammar(len(PARAMS), 2)
    for step in range(2):
        rows = per_row(PARAMS, PROMPT_LENS, step)
        for mode in ("raw", "processed"):
            s = ops.sample(special_rows(step)[:, start:end], group=group, vocab_size=V, strategy=strategy,
                           logprobs=2, logprobs_mode=mode, bitmask=mask if step else None, **rows)
            out[(step, mode)] = (s.token_ids.tolist(), s.num_nans.tolist(), s.fallback.tolist(),
                                 s.logprobs.token_ids.tolist(), s.logprobs.ranks.tolist(), s.logprobs.logprobs.tolist())
        lp = ops.logprobs(special_rows(step)[:, start:end], torch.arange(len(PARAMS)) * 7, 3, group=group,
                          vocab_size=V)
        out[(step, "logprobs")] = (lp.token_ids.tolist(), lp.ranks.tolist(), lp.logprobs.tolist())
    out["verify"] = _verify(group, strategy, start, end)
    return out


def _verify(group, strategy: str, start: int, end: int) -> tuple:
    """Drafts that are the plain token of their row (accepted) or not (rejected), by turns."""
    x = logits_at(9, sum(COUNTS) + len(COUNTS))[:, start:end]
    per = per_row(PARAMS[:len(COUNTS)], PROMPT_LENS[:len(COUNTS)], 0)
    n = torch.tensor(COUNTS) + 1
    rows = {k: torch.repeat_interleave(v, n) for k, v in per.items()}
    rows["positions"] = rows["positions"] + torch.cat([torch.arange(c) for c in n.tolist()])
    plain = ops.sample(x, group=group, vocab_size=V, strategy=strategy, **rows).token_ids.tolist()
    at = [sum(COUNTS[:i]) + i for i in range(len(COUNTS))]
    drafts = [[plain[a + j] if (i + j) % 2 == 0 else (plain[a + j] + 1) % V for j in range(c)]
              for i, (a, c) in enumerate(zip(at, COUNTS))]
    v = ops.verify_drafts(x, drafts, group=group, vocab_size=V, strategy=strategy, **per)
    return v.token_ids.tolist(), v.num_sampled.tolist(), v.num_rejected.tolist()


def _bad_calls(group) -> list[str]:
    """Bad arguments on every rank: each raises before any collective, so a good call after them
    still pairs up its collectives across ranks (a rank left inside one would hang it)."""
    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    start, end = tpsample.vocab_shard(V, tp, rank)
    x = logits_at(0, 3)
    good = dict(temperature=1.0, top_p=0.9, seeds=1, positions=0, group=group, vocab_size=V,
                strategy="vocab_parallel")
    messages = []
    for bad in (dict(top_p=2.0), dict(vocab_size=None), dict(logits=x), dict(positions=torch.tensor([0, -1, 0])),
                dict(strategy="fast")):
        args = dict(good, logits=x[:, start:end])
        args.update(bad)
        try:
            ops.sample(**args)
        except ValueError as e:
            messages.append(str(e))
    messages.append(ops.sample(**dict(good, logits=x[:, start:end])).token_ids.tolist())
    return messages


def _ranks(group) -> dict:
    got = {s: _case(group, s) for s in STRATEGIES}
    got["bad"] = _bad_calls(group)
    return got


@pytest.fixture(scope="module")
def tp1():
    return {"replicated": _case(None, "replicated")}       # at TP = 1 every strategy is this one


@pytest.fixture(scope="module", params=[2, 3])
def tp_run(request):
    return request.param, spawn_ranks(_ranks, request.param, timeout_s=120)


def _same(got: dict, want: dict, where: str) -> None:
    """Equal, except logprob values (the last field of logprob results): within 1e-5."""
    for key, w in want.items():
        g = got[key]
        assert g[:-1] == w[:-1] if key != "verify" else g == w, (where, key)
        if key != "verify":
            a, b = torch.tensor(g[-1]), torch.tensor(w[-1])
            assert torch.equal(a.isinf(), b.isinf()) and torch.allclose(a, b, atol=1e-5, rtol=0), (where, key)


def test_vocab_parallel_ops_equal_tp1_bitwise_over_gloo(tp1, tp_run):
    tp, ranks = tp_run
    for rank, res in enumerate(ranks):
        for s in STRATEGIES:
            _same(res[s], tp1["replicated"], f"tp={tp} rank={rank} {s}")
    ref = tp1["replicated"]
    assert any(any(step[2]) for step in (ref[(0, "raw")], ref[(1, "raw")]))     # the guard ran
    assert 0 < sum(ref["verify"][2]) < sum(COUNTS)                            # drafts accepted and rejected


def test_bad_arguments_raise_before_any_collective(tp_run):
    tp, ranks = tp_run
    for res in ranks:
        *errors, tokens = res["bad"]
        assert len(errors) == 5, errors
        assert "top_p must be in (0, 1]" in errors[0]
        assert "vocab_size must be given when the group has more than one rank" in errors[1]
        assert "logits must be this rank's shard" in errors[2]
        assert "positions[1]" in errors[3] and "strategy must be one of" in errors[4]
        assert tokens == ranks[0]["bad"][-1]
