"""The sampler against HF transformers' logits processors, composed in our order
(docs/semantics.md): RepetitionPenalty -> Temperature -> MinP -> TopK -> TopP.

Kept sets: the tokens our sampler can draw (finite entries of its processed logprobs over the
whole vocabulary) equal the tokens HF leaves finite. HF runs in float64 here; our fast path
decides in fp32, so a token whose decision sits within 1e-5 of a threshold (min-p cut or top-p
mass) may legitimately go either way: only such tokens may differ, and every differing token
must be one. Distributions: chi-square goodness of fit of 20,000 draws (one request per seed)
against HF's softmax of the processed scores, alpha = 0.001 (bins expecting < 20 pooled).
"""
from __future__ import annotations

import random

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import tpsample
from tpsample import SamplingParams as SP

ALPHA = 1e-3
AMBIGUOUS = 1e-5
INF = float("inf")


def hf_stages(scores: torch.Tensor, input_ids: torch.Tensor, c: dict) -> dict:
    """HF's chain on float64 scores [rows, V]; input_ids [rows, seq] (prompt + outputs).

    Returns the scores after temperature ("scaled"), before top-p ("pre_top_p") and at the end.
    """
    s = scores.double()
    if c.get("repetition_penalty", 1.0) != 1.0:
        s = RepetitionPenaltyLogitsProcessor(c["repetition_penalty"])(input_ids, s)
    if c.get("temperature", 1.0) != 1.0:
        s = TemperatureLogitsWarper(c["temperature"])(input_ids, s)
    scaled = s
    if c.get("min_p", 0.0) > 0:
        s = MinPLogitsWarper(c["min_p"])(input_ids, s)
    if c.get("top_k", -1) > 0:
        s = TopKLogitsWarper(c["top_k"])(input_ids, s)
    pre_top_p = s
    if c.get("top_p", 1.0) < 1:
        s = TopPLogitsWarper(c["top_p"])(input_ids, s)
    return {"scaled": scaled, "pre_top_p": pre_top_p, "final": s}


def ambiguous_tokens(stages: dict, c: dict, row: int) -> set[int]:
    """Tokens whose keep/drop decision is within AMBIGUOUS of the min-p cut or the top-p mass."""
    out = set()
    if c.get("min_p", 0.0) > 0:
        l = stages["scaled"][row]
        cut = l.max() + torch.log(torch.tensor(c["min_p"], dtype=torch.float64))
        out |= set(((l - cut).abs() < AMBIGUOUS).nonzero().flatten().tolist())
    if c.get("top_p", 1.0) < 1:
        l = stages["pre_top_p"][row]
        p = torch.softmax(l, dim=0)
        above = torch.stack([p[l > v].sum() for v in l])         # mass strictly above each token
        out |= set(((above - c["top_p"]).abs() < AMBIGUOUS).nonzero().flatten().tolist())
    return out


CONFIGS = [
    {"temperature": 0.6},
    {"top_k": 1}, {"top_k": 7}, {"top_k": 60},
    {"top_p": 0.3}, {"top_p": 0.9}, {"top_p": 0.99},
    {"min_p": 0.02}, {"min_p": 0.3},
    {"repetition_penalty": 1.8}, {"repetition_penalty": 0.6},
    {"temperature": 1.4, "top_k": 40, "top_p": 0.85},
    {"temperature": 0.7, "min_p": 0.01, "top_p": 0.95},
    {"repetition_penalty": 1.3, "temperature": 0.8, "min_p": 0.005, "top_k": 100, "top_p": 0.9},
]


def config_id(c: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in c.items())


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_kept_sets_equal_hf_chain(config):
    """64 rows (V = 300) x 3 steps, histories advancing: our kept set == HF's finite set, and our
    processed logprobs == HF's log-softmax of its processed scores (1e-5)."""
    vocab, rows, prompt_len = 300, 64, 12
    sampler = tpsample.Sampler(vocab, max_num_reqs=rows, seed=0, max_logprobs=vocab, strategy="replicated")
    rng = random.Random(0)
    ids = [f"r{i}" for i in range(rows)]
    for i, r in enumerate(ids):
        sampler.add_request(r, SP(seed=i, logprobs=vocab, logprobs_mode="processed", **config),
                            [rng.randrange(vocab) for _ in range(prompt_len)])
    num_ambiguous = 0
    for step in range(3):
        x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(step)) * 3
        history = torch.tensor([sampler.slots.get(r).prompt_token_ids + sampler.slots.get(r).output_token_ids
                                for r in ids])
        stages = hf_stages(x, history, config)
        plan = sampler.plan(ids)
        lp = sampler.sample(x, plan).logprobs
        for i in range(rows):
            ours = {int(t): float(v) for t, v in zip(lp.token_ids[i, 1:], lp.logprobs[i, 1:]) if v > -INF}
            theirs = set(torch.isfinite(stages["final"][i]).nonzero().flatten().tolist())
            diff = set(ours) ^ theirs
            assert diff <= ambiguous_tokens(stages, config, i), (i, sorted(diff))
            num_ambiguous += bool(diff)
            if not diff:
                want = torch.log_softmax(stages["final"][i], dim=0)
                got = torch.tensor([ours[t] for t in sorted(theirs)], dtype=torch.float64)
                assert torch.allclose(got, want[sorted(theirs)], atol=1e-5, rtol=0)
    assert num_ambiguous <= 2


def chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's chi-square p-value; bins expecting fewer than 20 counts are pooled into one
    (small expected counts fatten the statistic's tail beyond the chi-square law)."""
    small = expected < 20
    obs = torch.cat([observed[~small], observed[small].sum().reshape(1)]).double()
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)]).double()
    if float(exp[-1]) == 0:
        obs, exp = obs[:-1], exp[:-1]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = torch.tensor((obs.numel() - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, stat / 2))


DIST_CONFIGS = [
    {"temperature": 0.7}, {"temperature": 1.6}, {"top_k": 10}, {"top_p": 0.8}, {"min_p": 0.05},
    {"repetition_penalty": 1.5},
    {"repetition_penalty": 1.3, "temperature": 1.3, "min_p": 0.02, "top_k": 20, "top_p": 0.9},
]


@pytest.mark.parametrize("config", DIST_CONFIGS, ids=config_id)
def test_sampled_distribution_matches_hf_softmax(config):
    """20,000 requests (seeds 0..19999) sample one row (V = 50): the token counts fit HF's
    softmax of the processed scores (chi-square, alpha = 0.001); HF-dropped tokens never appear."""
    vocab, draws = 50, 20_000
    row = torch.randn(1, vocab, generator=torch.Generator().manual_seed(1)) * 2
    prompt = row[0].topk(6).indices.tolist()[::2] + [7, 8, 9]       # some strong tokens were seen
    stages = hf_stages(row, torch.tensor([prompt]), config)
    assert not ambiguous_tokens(stages, config, 0)                  # a clear-cut row
    probs = torch.softmax(stages["final"][0], dim=0)
    sampler = tpsample.Sampler(vocab, max_num_reqs=draws, seed=0, strategy="replicated")
    ids = [f"r{i}" for i in range(draws)]
    for i, r in enumerate(ids):
        sampler.add_request(r, SP(seed=i, **config), prompt)
    out = sampler.sample(row.expand(draws, vocab).contiguous(), sampler.plan(ids))
    counts = torch.bincount(out.sampled_token_ids[:, 0], minlength=vocab)
    assert int(counts[probs == 0].sum()) == 0
    assert chi2_pvalue(counts[probs > 0], draws * probs[probs > 0]) > ALPHA
