"""What RL trainers read back: the logprob modes (vLLM's raw/processed x logprobs/logits, and
logprobs after the temperature only) and each sampled row's kept support (bounds, count, the
most probable kept ids), against the float64 reference, through every strategy at TP = 1, the
kernels' split (interpreter on CPU), and at TP 2 and 3 (gloo) bitwise equal to TP = 1."""
from __future__ import annotations

import random

import numpy as np
import pytest
import reference as ref
import torch
from test_semantics_reference import EOS, STRATEGIES, V, add_all, check_logprobs, new_sampler, randn_logits

import tpsample
from tpsample import SamplingParams as SP
from tpsample.parallel.launch import spawn_ranks
from tpsample.params import LOGPROBS_MODES

INF = float("inf")


def _params(i: int) -> SP:
    rng = random.Random(i)
    return SP(temperature=rng.choice([0.0, 0.6, 1.0, 1.7]), seed=i, top_k=rng.choice([-1, 4, 40]),
              top_p=rng.choice([1.0, 0.8]), min_p=rng.choice([0.0, 0.02]), top_n_sigma=rng.choice([-1.0, 2.5]),
              xtc_probability=rng.choice([0.0, 1.0]), xtc_threshold=0.05,
              repetition_penalty=rng.choice([1.0, 1.3]), logit_bias={i % V: 3.0},
              logprobs=rng.choice([None, 0, 3]), logprobs_mode=LOGPROBS_MODES[i % len(LOGPROBS_MODES)],
              kept_support=rng.choice([None, 0, 2, 30, V]))


def _check(sampler, ids, logits):
    """One step; every row's logprobs and kept support against the reference."""
    states = [sampler.slots.get(r) for r in ids]
    history = [list(st.output_token_ids) for st in states]
    plan = sampler.plan(ids)
    out = sampler.sample(logits[plan.logits_order].clone(), plan)
    support = out.kept_support
    for i, st in enumerate(states):
        p = st.params
        row = logits[i].double().tolist()
        pos = len(st.prompt_token_ids) + len(history[i])
        want = ref.sample_row(row, p, st.seed, pos, st.prompt_token_ids, history[i], EOS)
        assert out.tokens(i) == [want["token"]], (i, p)
        if p.logprobs is not None:
            check_logprobs(out.logprobs, i, want["logprobs"], p.logprobs)
        if p.kept_support is None:
            assert support is None or int(support.count[i]) == -1
            continue
        kept_ids, count = want["support"]
        assert int(support.count[i]) == count, (i, p)
        assert support.token_ids[i, : len(kept_ids)].tolist() == kept_ids, (i, p)
        assert bool((support.token_ids[i, len(kept_ids):] == -1).all())
        _check_bounds(row, p, st, history[i], float(support.threshold[i]), float(support.upper[i]), kept_ids, count)
    return out


def _check_bounds(row, p, st, history, thr, upper, kept_ids, count):
    """The bounds hold exactly the kept tokens of the row after the temperature."""
    proc = ref.process_row(row, p, st.prompt_token_ids, history, EOS, None)
    scaled = [v / p.temperature for v in proc] if p.temperature > 0 else proc
    inside = [t for t, v in enumerate(scaled) if v > -INF and thr - 1e-5 <= v <= upper + 1e-5]
    assert len(inside) == count or p.temperature == 0, (p, thr, upper)
    assert set(kept_ids) <= set(inside)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_logprob_modes_and_kept_supports_match_the_reference(strategy):
    sampler = new_sampler(strategy=strategy)
    ids = add_all(sampler, [_params(i) for i in range(70)])
    for step in range(3):
        _check(sampler, ids, randn_logits(len(ids), step, seed=3))


def test_short_mode_names_are_aliases_of_vllm_names():
    rows = randn_logits(6, 0)
    got = {}
    for mode in ("raw", "raw_logprobs", "processed", "processed_logprobs"):
        sampler = new_sampler()
        ids = add_all(sampler, [SP(top_k=5, seed=i, logprobs=4, logprobs_mode=mode) for i in range(6)])
        plan = sampler.plan(ids)
        lp = sampler.sample(rows.clone(), plan).logprobs
        got[mode] = (lp.token_ids.tolist(), lp.logprobs.tolist(), lp.ranks.tolist())
    assert got["raw"] == got["raw_logprobs"] and got["processed"] == got["processed_logprobs"]
    assert got["raw"] != got["processed"]


def test_temperature_logprobs_are_the_raw_rows_log_softmax_over_t():
    sampler = new_sampler()
    rows = randn_logits(4, 1)
    params = [SP(temperature=t, top_k=3, repetition_penalty=2.0, seed=1, logprobs=V,
                 logprobs_mode="temperature_logprobs") for t in (0.5, 1.0, 2.0, 0.0)]
    ids = add_all(sampler, params, prompts=[[1, 2]] * 4)
    plan = sampler.plan(ids)
    lp = sampler.sample(rows.clone(), plan).logprobs
    for i, p in enumerate(params):
        want = torch.log_softmax(rows[i].double() / (p.temperature or 1.0), dim=0)
        got = torch.full((V,), -INF, dtype=torch.float64)
        got[lp.token_ids[i, 1:]] = lp.logprobs[i, 1:].double()
        assert torch.allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_kernels_split_gives_the_references_logprobs_and_kept_supports(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    sampler = new_sampler(auto_graph=False)
    ids = add_all(sampler, [_params(i) for i in range(24)])
    _check(sampler, ids, randn_logits(len(ids), 0, seed=5))


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_kernels_give_kept_supports_themselves_bitwise_the_torch_backends(monkeypatch):
    """Every row's ids, count and bounds from the kernels' kept pass equal the torch backend's, on
    rows with each filter (and XTC) and greedy rows; no row is left to the torch backend."""
    from scenarios import kernels_beside_torch
    pytest.importorskip("triton")
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    filters = [{}, {"top_k": 7}, {"top_p": 0.8}, {"min_p": 0.05}, {"top_n_sigma": 1.5}, {"top_k": 40, "top_p": 0.9},
               {"xtc_probability": 1.0, "xtc_threshold": 0.02, "top_p": 0.95}, {"temperature": 0.0}]
    params = [SP(**{"temperature": 0.9, **f}, seed=i, kept_support=(None, 0, 3, V)[i % 4])
              for i, f in enumerate(filters * 2)]
    x = randn_logits(len(params), 2) * 2
    x[3, :20] = -INF
    slow, mixed, alone = kernels_beside_torch(params, x)
    assert slow == []
    assert torch.equal(mixed.emitted, alone.emitted)
    for got, want in zip(mixed.support, alone.support):
        assert torch.equal(got, want)
    asked = [i for i, p in enumerate(params) if p.kept_support is not None and p.temperature > 0]
    assert bool((mixed.support[2][asked] > -INF).all())        # the smallest kept value


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_kernels_give_raw_logits_themselves_bitwise_the_torch_backends(monkeypatch):
    from scenarios import kernels_beside_torch
    pytest.importorskip("triton")
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    params = [SP(temperature=(0.0, 0.7, 1.3)[i % 3], top_k=(-1, 20)[i % 2], seed=i, logprobs=(0, 3, 5)[i % 3],
                 logprobs_mode=("raw_logits", "raw_logprobs", "raw_logits", "temperature_logprobs")[i % 4])
              for i in range(12)]
    x = randn_logits(len(params), 1)
    x[2, :30] = -INF
    slow, mixed, alone = kernels_beside_torch(params, x)
    assert slow == []                                # logprobs after the temperature included
    logits = [i for i, p in enumerate(params) if p.logprobs_mode == "raw_logits"]
    assert torch.equal(mixed.emitted, alone.emitted) and torch.equal(mixed.lp_ids, alone.lp_ids)
    assert torch.equal(mixed.lp_vals[logits], alone.lp_vals[logits])            # the values themselves
    assert torch.equal(mixed.lp_vals[logits, 0], x[logits].gather(1, mixed.emitted[logits, None])[:, 0])
    assert torch.allclose(mixed.lp_vals, alone.lp_vals, atol=1e-5) and torch.equal(mixed.lp_ranks, alone.lp_ranks)


def _temperature_lp_params(n: int) -> list:
    modes = ("temperature_logprobs", "raw_logprobs", "temperature_logprobs", "raw_logits")
    return [SP(temperature=(0.0, 0.5, 1.3, 2.0, 0.7)[i % 5], top_k=(-1, 20)[i % 2], seed=i, logprobs=(0, 3, 5)[i % 3],
               logprobs_mode=modes[i % 4]) for i in range(n)]


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_kernels_give_logprobs_after_the_temperature_themselves_bitwise_on_the_divided_row(monkeypatch):
    """Rows asking for logprobs after the temperature stay on the kernels: the torch backend's
    tokens, ids and ranks, and values bitwise the kernels' raw logprobs of the row fp32(x) / T
    divided by torch (greedy rows: / 1). The log-sum-exp's last ulp is the only difference to the
    torch backend's values (the kernels' exp sums blocks in fp32, as for raw logprobs)."""
    from scenarios import kernels_beside_torch

    from tpsample.kernels.sample import token_logprob_stats
    from tpsample.sampling.logprobs import blank_unasked, finite_logprobs
    pytest.importorskip("triton")
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    params = _temperature_lp_params(15)
    x = randn_logits(len(params), 1) * 2
    x[2, :30] = -INF
    slow, mixed, alone = kernels_beside_torch(params, x)
    assert slow == []
    assert torch.equal(mixed.emitted, alone.emitted) and torch.equal(mixed.lp_ids, alone.lp_ids)
    assert torch.equal(mixed.lp_ranks, alone.lp_ranks)
    assert torch.allclose(mixed.lp_vals, alone.lp_vals, atol=1e-5)
    rows = [i for i, p in enumerate(params) if p.logprobs_mode == "temperature_logprobs"]
    l = x[rows] / torch.tensor([params[i].temperature or 1.0 for i in rows]).unsqueeze(1)
    lse, *_ = token_logprob_stats(l, None, 5, tokens=mixed.emitted[rows])
    ids = mixed.lp_ids[rows]
    want = finite_logprobs(ids, l.gather(1, ids.clamp(min=0)), lse)
    want = blank_unasked((ids.clone(), want, None), torch.tensor([params[i].logprobs for i in rows]))[1]
    assert torch.equal(mixed.lp_vals[rows], want)


@pytest.mark.usefixtures("triton_interpreter")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_batch_without_logprobs_after_the_temperature_launches_what_it_did_and_one_with_them_divides(monkeypatch):
    """The per-row divisor is a constexpr switch: a batch whose rows want raw logprobs or logits
    only runs the stats and layout kernels without HAS_T; one row after the temperature turns it
    on in both, with the same launches."""
    from scenarios import kernels_beside_torch

    from tpsample.kernels import launcher
    launched = []
    call = launcher.Launcher.__call__

    def record(self, grid, *args, **constexprs):
        if self.fn.__name__ in ("stats_kernel", "_raw_logprobs_kernel"):
            launched.append((self.fn.__name__, constexprs.get("HAS_T")))
        return call(self, grid, *args, **constexprs)

    monkeypatch.setattr(launcher.Launcher, "__call__", record)
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    x = randn_logits(4, 1)
    params = [SP(temperature=0.8, seed=i, logprobs=2, logprobs_mode=("raw_logprobs", "raw_logits")[i % 2])
              for i in range(4)]
    kernels_beside_torch(params, x)
    plain = list(launched)
    launched.clear()
    kernels_beside_torch(params[:3] + [SP(temperature=0.8, seed=3, logprobs=2, logprobs_mode="temperature_logprobs")],
                         x)
    assert plain == [("stats_kernel", False), ("_raw_logprobs_kernel", False)]
    assert launched == [("stats_kernel", True), ("_raw_logprobs_kernel", True)]


def _run(group, strategy: str) -> list:
    """Every strategy's tokens, logprobs and kept supports over 3 steps of the same requests."""
    sampler = tpsample.Sampler(V, strategy=strategy, group=group, seed=0, eos_token_id=EOS, max_logprobs=V,
                               max_num_reqs=64)
    start, end = tpsample.vocab_shard(V, sampler.tp_size, sampler.rank)
    ids = add_all(sampler, [_params(i) for i in range(40)])
    got = []
    for step in range(3):
        plan = sampler.plan(ids)
        full = randn_logits(len(ids), step, seed=3)[plan.logits_order]
        out = sampler.sample(full[:, start:end].contiguous(), plan)
        ks, lp = out.kept_support, out.logprobs
        got.append((out.token_lists(), lp.token_ids.tolist(), np.round(lp.logprobs.numpy(), 5).tolist(),
                    lp.ranks.tolist(), ks.token_ids.tolist(), ks.count.tolist(), ks.threshold.tolist(),
                    ks.upper.tolist()))
    return got


def _all_strategies(group) -> dict:
    return {s: _run(group, s) for s in ("replicated", "batch_sharded", "vocab_parallel")}


@pytest.mark.parametrize("tp", [2, 3])
def test_every_strategy_at_tp_2_and_3_returns_tp1s_supports_and_logprobs(tp):
    want = _run(None, "replicated")
    assert any(c > 0 for step in want for c in step[5])
    for rank, res in enumerate(spawn_ranks(_all_strategies, tp, timeout_s=240)):
        for strategy, got in res.items():
            assert got == want, f"tp={tp} rank={rank} {strategy}"


@pytest.mark.parametrize("field,value", [("kept_support", -1), ("kept_support", 1 << 17),
                                         ("logprobs_mode", "logits")])
def test_bad_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field} must be"):
        SP(**{field: value})


def test_ops_take_vllms_logprob_names_and_refuse_the_modes_they_do_not_compute():
    from tpsample import ops
    x = randn_logits(3, 0)
    kw = dict(temperature=0.8, top_k=5, seeds=1, positions=0, logprobs=3)
    for short, long in (("raw", "raw_logprobs"), ("processed", "processed_logprobs")):
        a, b = ops.sample(x, logprobs_mode=short, **kw).logprobs, ops.sample(x, logprobs_mode=long, **kw).logprobs
        assert torch.equal(a.logprobs, b.logprobs) and torch.equal(a.token_ids, b.token_ids)
    for mode in ("raw_logits", "processed_logits", "temperature_logprobs"):
        with pytest.raises(ValueError, match="logprobs_mode must be one of"):
            ops.sample(x, logprobs_mode=mode, **kw)
