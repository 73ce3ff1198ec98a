"""Every SamplingParams field is applied on every path or refused: each sampler field, set away
from its default, changes the output (tokens, logprobs or kept support) under every strategy at
TP 2 (gloo) and at TP 1, with and without draft tokens to verify (spec decode), and the outputs
are bitwise TP 1's; a CUDA-graph capture refuses exactly the fields the recorded step cannot
apply. Front-end fields (`state.digest.FRONT_END_FIELDS`: lengths, stop strings) never reach
the sampler and are the front ends' to apply (their own tests).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import tpsample
from tpsample import SamplingParams as SP
from tpsample.parallel.launch import spawn_ranks
from tpsample.state.digest import FRONT_END_FIELDS

V = 64
EOS = 9
HOT = 8                                    # a token the rows like; the prompt repeats up to it
PROMPT = [5, 6, 7, HOT, 5, 6, 7, HOT, 5, 6, 7]
GROUP = 4                                  # requests per variant (different logits)
STRATEGIES = ("replicated", "batch_sharded", "vocab_parallel")
BASE = dict(temperature=0.7, logprobs=3, logprobs_mode="processed")

# field -> (what the base also sets, the field's value in the variant)
VARIANTS = {
    "temperature": ({}, 0.3),
    "top_k": ({}, 3),
    "top_p": ({}, 0.5),
    "min_p": ({}, 0.2),
    "seed": ({}, 1000),
    "repetition_penalty": ({}, 2.0),
    "frequency_penalty": ({}, 2.0),
    "presence_penalty": ({}, -2.0),
    "logit_bias": ({}, {3: 6.0, 4: -6.0}),
    "allowed_token_ids": ({}, list(range(20, 40))),
    "bad_words_token_ids": ({}, [[HOT], [7, 3]]),
    "min_tokens": ({"stop_token_ids": [HOT, 3]}, 3),
    "stop_token_ids": ({"min_tokens": 3}, [HOT, 3]),
    "ignore_eos": ({"min_tokens": 3}, True),
    "logprobs": ({}, 6),
    "logprobs_mode": ({}, "raw_logits"),
    "dry_multiplier": ({}, 1.0),
    "dry_base": ({"dry_multiplier": 1.0}, 3.0),
    "dry_allowed_length": ({"dry_multiplier": 1.0}, 9),
    "dry_penalty_last_n": ({"dry_multiplier": 1.0}, 3),
    "dry_sequence_breakers": ({"dry_multiplier": 1.0}, [[6]]),
    "top_n_sigma": ({}, 0.7),
    "xtc_probability": ({}, 1.0),
    "xtc_threshold": ({"xtc_probability": 1.0}, 0.01),
    "kept_support": ({}, 5),
}
# what a CUDA-graph capture refuses (the rows the torch backend samples; min_tokens still to reach);
# every other field, DRY included, records
CAPTURE_REFUSES = {"top_n_sigma", "xtc_probability", "xtc_threshold", "kept_support", "logprobs_mode",
                   "min_tokens", "stop_token_ids"}


def _requests() -> list[tuple[str, SP]]:
    out = []
    for field, (extra, value) in VARIANTS.items():
        for g in range(GROUP):
            base = {**BASE, "seed": g, **extra}
            out.append((f"{field}/{g}/base", SP(**base)))
            out.append((f"{field}/{g}/variant", SP(**{**base, field: value})))
    return out


def _logits(req_id: str, step: int, rows: int) -> torch.Tensor:
    """Rows that depend on the request's group and the step only (base and variant see the same)."""
    field, g, _ = req_id.split("/")
    seed = sum(ord(c) for c in field) * 101 + int(g) * 7 + step
    x = torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 2
    x[:, HOT] += 12.0 if field.startswith("dry") else 4.0     # DRY's penalties show on a dominant token
    x[:, EOS] += 3.0
    return x


def _drafts(req_id: str, step: int) -> list[int]:
    """0 to 2 draft tokens, the same for a group's base and variant."""
    g = int(req_id.split("/")[1])
    return [(step * 5 + g) % V, HOT][: (g + step) % 3]


def run(group, strategy: str, drafts: bool) -> dict:
    """req id -> per step (tokens, logprobs ids and values, kept support), this strategy."""
    sampler = tpsample.Sampler(V, strategy=strategy, group=group, seed=0, eos_token_id=EOS, max_num_reqs=256,
                               max_num_logits_per_req=3, auto_graph=False)
    start, end = tpsample.vocab_shard(V, sampler.tp_size, sampler.rank)
    reqs = _requests()
    for r, p in reqs:
        sampler.add_request(r, p, PROMPT)
    ids = [r for r, _ in reqs]
    got = {r: [] for r in ids}
    for step in range(3):
        dr = [_drafts(r, step) for r in ids] if drafts else None
        plan = sampler.plan(ids, draft_token_ids=dr)
        full = torch.cat([_logits(r, step, int(plan.rows_per_req[i])) for i, r in enumerate(ids)])
        out = sampler.sample(full[plan.logits_order][:, start:end].contiguous(), plan)
        lp, ks = out.logprobs, out.kept_support
        for i, r in enumerate(ids):
            row = plan.row_start[i]
            entry = [out.tokens(i), lp.token_ids[row].tolist(), lp.logprobs[row].tolist()]
            if ks is not None:
                entry += [ks.token_ids[row].tolist(), int(ks.count[row]), float(ks.threshold[row])]
            got[r].append(entry)
    return got


def _all(group) -> dict:
    return {(s, d): run(group, s, d) for s in STRATEGIES for d in (False, True)}


@pytest.fixture(scope="module")
def tp1():
    return {(s, d): run(None, s, d) for s in STRATEGIES for d in (False, True)}


def test_every_sampler_field_has_a_variant_here():
    fields = {f.name for f in dataclasses.fields(SP)} - FRONT_END_FIELDS
    assert fields == set(VARIANTS), sorted(fields ^ set(VARIANTS))


@pytest.mark.parametrize("drafts", [False, True], ids=["decode", "spec_decode"])
def test_every_field_changes_the_output_under_every_strategy(tp1, drafts):
    for strategy in STRATEGIES:
        got = tp1[(strategy, drafts)]
        for field in VARIANTS:
            changed = [got[f"{field}/{g}/base"] != got[f"{field}/{g}/variant"] for g in range(GROUP)]
            assert any(changed), f"{field} changed nothing under {strategy} (drafts={drafts})"


def _same(a: list, b: list) -> bool:
    """Tokens, logprob ids and kept supports bitwise; logprob values within 1e-5 (float sums)."""
    def close(x, y):
        return all(u == v or abs(u - v) <= 1e-5 for u, v in zip(x, y, strict=True))
    return all(s[:2] == t[:2] and s[3:] == t[3:] and close(s[2], t[2]) for s, t in zip(a, b, strict=True))


def test_every_strategy_at_tp_2_gives_tp1s_outputs(tp1):
    """Tokens and kept supports bitwise, logprobs to 1e-5, every strategy and TP 2 against TP 1."""
    want = {d: tp1[("replicated", d)] for d in (False, True)}
    results = [tp1] + spawn_ranks(_all, 2, timeout_s=300)
    for rank, res in enumerate(results):
        for (s, d), got in res.items():
            bad = [r for r in got if not _same(got[r], want[d][r])]
            assert not bad, f"{'tp 1' if rank == 0 else f'tp 2 rank {rank - 1}'} {s} drafts={d}: {bad[:4]}"


def test_a_capture_refuses_exactly_the_fields_a_recorded_step_cannot_apply():
    from tpsample.replay import check_capturable
    sampler = tpsample.Sampler(V, seed=0, eos_token_id=EOS, max_num_reqs=256)
    refused = set()
    for field, (extra, value) in VARIANTS.items():
        rid = f"{field}/capture"
        sampler.add_request(rid, SP(**{**BASE, "logprobs_mode": "raw", **extra, field: value}), PROMPT)
        try:
            check_capturable(sampler, sampler.plan([rid]))
        except ValueError as err:
            assert field in str(err) or "min_tokens" in str(err) or "logprobs_mode" in str(err), (field, err)
            refused.add(field)
        sampler.remove_request(rid)
    assert refused == CAPTURE_REFUSES          # logprobs_mode: its variant asks for logits ("raw" records)
