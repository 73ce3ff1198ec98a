"""Flat rows under vocab_parallel: Zipf-like logits (a real model's rows at T 1) at top-p 0.95
keep tens of thousands of tokens, and the band method settles them in its two rounds; the exact
top-p path stays for at most 1% of the rows. Tokens are TP = 1's."""
from __future__ import annotations

import pytest

import tpsample
from tpsample.bench.sampler import make_logits
from tpsample.parallel.launch import spawn_ranks

V = 32768
ROWS = 200
STEPS = 2


def _params(i: int) -> tpsample.SamplingParams:
    return tpsample.SamplingParams(temperature=1.0, top_p=0.95, seed=7 + i, max_tokens=100)


def _zipf_steps(group):
    """Per step: (tokens, exact-path rows, rounds) of ROWS Zipf-like rows."""
    s = tpsample.Sampler(V, max_num_reqs=ROWS, strategy="vocab_parallel" if group is not None else "replicated",
                         group=group, seed=1)
    start, end = tpsample.vocab_shard(V, s.tp_size, s.rank)
    ids = [f"z{i}" for i in range(ROWS)]
    for i, r in enumerate(ids):
        s.add_request(r, _params(i), [1])
    out = []
    for step in range(STEPS):
        x = make_logits("zipf", ROWS, V, 500 + step, "cpu")[:, start:end].contiguous()
        o = s.sample(x, s.plan(ids))
        out.append((o.sampled_token_ids[:, 0].tolist(), s.last_stats.exact_rows, s.last_stats.num_rounds))
    return out


@pytest.fixture(scope="module")
def tp1():
    return _zipf_steps(None)


@pytest.mark.parametrize("tp", [2, 3])
def test_flat_zipf_rows_settle_in_two_rounds_with_at_most_one_percent_exact(tp, tp1):
    for rank, steps in enumerate(spawn_ranks(_zipf_steps, tp, timeout_s=600)):
        for step, ((tokens, exact, rounds), (want, _, _)) in enumerate(zip(steps, tp1)):
            assert tokens == want, (tp, rank, step)
            assert exact <= ROWS // 100, (tp, rank, step, exact)
            assert rounds == (2 if exact == 0 else 2 + 5), (tp, rank, step, rounds)
