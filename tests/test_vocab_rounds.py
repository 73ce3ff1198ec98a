"""vocab_parallel in few rounds, no host reads, and the measured `auto`, on gloo ranks.

Every case runs inside one TP=2 process group (round_cases.all_cases); the tests check what the
ranks returned against a TP=1 reference computed here.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from round_cases import NO_HOST_READ, ROWS, WORKLOADS, V, all_cases, run_workload
from scenarios import step_logits

import tpsample
from tpsample.parallel.launch import spawn_ranks

TWO_ROUNDS = ("top_k", "top_k_top_p", "min_p", "top_k_min_p", "top_p", "top_p_min_p", "mixed")


@pytest.fixture(scope="module")
def ranks():
    return spawn_ranks(all_cases, 2, timeout_s=600)


@pytest.fixture(scope="module")
def tp1():
    return {name: run_workload(None, name, "replicated") for name in WORKLOADS}


def test_vocab_parallel_gives_tp1_tokens_and_logprobs_for_every_filter(ranks, tp1):
    for rank, res in enumerate(ranks):
        for name, steps in res["runs"].items():
            for step, (got, want) in enumerate(zip(steps, tp1[name])):
                assert got["tokens"] == want["tokens"], f"rank {rank} {name} step {step}"
                if want["lp"] is not None:
                    ids, vals, rk = got["lp"]
                    assert ids == want["lp"][0] and rk == want["lp"][2], f"{name} step {step}"
                    assert np.allclose(vals, want["lp"][1], atol=1e-5, rtol=0)


def test_vocab_parallel_rounds_per_step(ranks):
    """greedy / temperature: one gather (the winners); any filter: two; logprobs: one more; only
    top-p without top-k may take the exact path, and then says so in exact_rows."""
    for res in ranks:
        runs = res["runs"]
        for name, steps in runs.items():
            for st in steps:
                extra = 0 if st["exact_rows"] == 0 else 5          # radix (4 sums) + re-draw gather
                if name in ("greedy", "temperature"):
                    assert st["rounds"] == 1, name
                elif name in TWO_ROUNDS:
                    assert st["rounds"] == 2 + extra, (name, st)
                elif name in ("top_k_top_p+logprobs", "mixed+processed", "top_p+logprobs", "top_p+processed"):
                    assert st["rounds"] == 3 + extra, (name, st)
                if not name.startswith("top_p") and name != "mixed":
                    assert st["exact_rows"] == 0, name
        # realistic logits at V = 4099: the band method decides these rows without the exact path
        for name in ("top_p", "top_p+processed"):
            assert all(st["exact_rows"] == 0 for st in runs[name]), runs[name]


def test_vocab_parallel_moves_a_few_kib(ranks):
    for res in ranks:
        st = res["runs"]["top_k_top_p"][0]
        assert 0 < st["bytes"] < ROWS * (51 + 8 + 16) * 4 + 1024     # top-51 values, winners, padding


def test_no_host_read_inside_a_step(ranks):
    """Nothing in a step reads the device (on CUDA each read is a stream sync), except the one
    decision whether a top-p-without-top-k row needs the exact path."""
    for res in ranks:
        for (name, strategy), calls in res["reads"].items():
            if name in NO_HOST_READ.get(strategy, ()):
                assert calls == [], (name, strategy, calls)
        assert res["reads"][("top_p", "vocab_parallel")] == ["nonzero"]


def test_forced_exact_top_p_path_gives_the_full_row_tokens(ranks):
    from tpsample.sampling.processors import PROCESSORS
    from tpsample.sampling.recipe import SampleArgs, sample_rows
    from tpsample.sampling.reducer import LocalRows
    from tpsample.sampling.torch_backend import TORCH
    from tpsample.state.rows import RowsView
    from tpsample.state.store import RequestStore
    store = RequestStore(V, ROWS, None, PROCESSORS)
    for i in range(ROWS):
        p = WORKLOADS["top_p+logprobs"](i)
        store.add(str(i), p, [1, 2], p.seed)
    store.sync(torch.device("cpu"), 1)
    b = store.row_batch(RowsView(np.arange(ROWS), np.zeros(ROWS, np.int64), np.full(ROWS, -1, np.int64)),
                        torch.device("cpu"))
    full = sample_rows(SampleArgs(step_logits(5, 0, ROWS, V), 0, b, LocalRows()), backend=TORCH)
    for res in ranks:
        got = res["forced"]
        assert got["exact_rows"] == ROWS
        assert got["tokens"] == full.emitted.tolist()
        assert got["lp"] == full.lp_ids.tolist() and got["ranks"] == full.lp_ranks.tolist()
        assert got["collectives"] == 1 + 1 + 4 + 1 + 1     # summary, winners, radix, re-draw, logprobs


def test_auto_makes_the_same_fixed_choice_on_every_rank_for_every_shape(ranks):
    """Every rank plans every grid shape with the same fixed strategy (a rank that chose
    differently would deadlock the collectives). How fast the choice is, against the fixed
    strategies' measured steps, is a benchmark's claim (docs/auto.md), not a timed test's."""
    grids = [r["auto"]["grid"] for r in ranks]
    shapes = {(g["vocab"], g["rows"]) for g in grids[0]}
    assert shapes == {(v, r) for v in (1000, 32000) for r in (1, 8, 64)}
    assert [g["choice"] for g in grids[0]] == [g["choice"] for g in grids[1]]
    assert {g["choice"] for g in grids[0]} <= {"replicated", "batch_sharded", "vocab_parallel"}


def test_auto_measurements_are_identical_on_every_rank(ranks):
    a, b = ranks[0]["auto"]["calibration"], ranks[1]["auto"]["calibration"]
    assert a == b
    for vocab, comm, steps in a:
        assert comm.latency_s > 0 and comm.gather_Bps > 0 and len(steps) == 1
        assert all(x > 0 for x in steps[0].intercept)


def test_auto_device_defaults_to_the_logits_device():
    s = tpsample.Sampler(64, strategy="auto", seed=1)
    assert s.device is None and s._device_type() == "cpu"
    s.add_request("a", tpsample.SamplingParams(temperature=0.5, seed=1), [1])
    s.sample(torch.randn(1, 64), s.plan(["a"]))
    assert s.device == torch.device("cpu")
