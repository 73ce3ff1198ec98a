"""DRY against a line-by-line Python port of llama.cpp's `llama_sampler_dry_apply`
(`src/llama-sampling.cpp`: breaker scan, reverse Z-algorithm, per-token maximum, capped
exponent), on random contexts over a small alphabet (so repeats and breakers are common): the
processed rows are equal bit for bit, for contexts made of the prompt, the outputs and the drafts
before a row, on full rows and vocab shards, and the sampler's tokens follow.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import reference as ref
import torch

import tpsample
from tpsample import SamplingParams as SP
from tpsample.sampling.processors import PROCESSORS, apply_processors
from tpsample.state.rows import RowsView
from tpsample.state.store import RequestStore

V = 12


def llama_dry(logits, context, multiplier, base, allowed, last_n, breakers):
    """llama_sampler_dry_apply on one row (fp32 values), context = the tokens accepted so far."""
    f32 = np.float32
    out = [f32(v) for v in logits]
    if multiplier == 0 or base < 1 or last_n == 0:
        return out
    eff = len(context) if last_n == -1 else max(last_n, 0)      # -1: the whole context
    last_n_repeat = min(len(context), eff)
    if last_n_repeat <= allowed:
        return out
    rat = lambda i: context[len(context) - 1 - i]  # noqa: E731
    # step 1: the most recent breaker limits the repeat length
    rep_limit = last_n_repeat
    for i in range(last_n_repeat):
        tails = [list(w[1:]) for w in breakers if w[0] == rat(i)]
        longest = -1
        for tail in tails:
            s = len(tail)
            if longest < s <= i and all(tail[o] == rat(i - o - 1) for o in range(s)):
                longest = s
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed:
        return out
    # step 2: the reverse Z-algorithm
    count = [0] * last_n_repeat
    last, rt, lt = last_n_repeat - 1, 0, 0
    for k in range(1, last_n_repeat):
        if k > rt:
            n = 0
            while n + k < last_n_repeat and rat(n) == rat(n + k):
                n += 1
            count[last - k] = min(n, rep_limit)
            if n > 0:
                lt, rt = k, k + n - 1
        else:
            p = k - lt
            right_part_len = rt - k + 1
            if count[last - p] < right_part_len:
                count[last - k] = min(count[last - p], rep_limit)
            else:
                i = rt + 1
                while i < last_n_repeat and rat(i) == rat(i - k):
                    i += 1
                count[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1
    # step 3: the longest repeat each token would extend
    longest_for = {}
    for i in range(last_n_repeat - 1):
        if count[i] >= allowed:
            tok = rat(last_n_repeat - 2 - i)
            longest_for[tok] = max(longest_for.get(tok, 0), count[i])
    # step 4: the penalties (float penalty = multiplier * std::pow(base, exp), exp capped)
    max_exponent = 0
    if f32(base) > f32(1.000001):
        max_exponent = int(f32(f32(88.7228391) / np.log(f32(base))))
    for tok, n in longest_for.items():
        if any(len(w) == 1 and w[0] == tok for w in breakers):
            continue
        e = n - allowed
        if max_exponent > 0 and e > max_exponent:
            e = max_exponent
        penalty = f32(float(f32(multiplier)) * math.pow(float(f32(base)), e))
        out[tok] = f32(out[tok] - penalty)
    return out


def _random_case(rng: random.Random):
    alphabet = rng.choice([3, 5, V])
    prompt = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 14))]
    outputs = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 10))]
    drafts = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 3))]
    breakers = [[rng.randrange(V)] for _ in range(rng.randrange(0, 3))]
    breakers += [[rng.randrange(alphabet) for _ in range(rng.randrange(2, 4))] for _ in range(rng.randrange(0, 3))]
    p = SP(dry_multiplier=rng.choice([0.8, 2.0, 0.05]), dry_base=rng.choice([1.0, 1.75, 3.0, 100.0]),
           dry_allowed_length=rng.randrange(0, 4), dry_penalty_last_n=rng.choice([-1, 1, 4, 9, 40]),
           dry_sequence_breakers=breakers or None)
    return p, prompt, outputs, drafts


def _processed_rows(cases, logits, col_start: int = 0):
    """Each case's row after steps 3-5 (the processors), its context being prompt + outputs + drafts."""
    store = RequestStore(V, len(cases), None, PROCESSORS)
    for i, (p, prompt, _, _) in enumerate(cases):
        store.add(str(i), p, prompt, 0)
    n = len(cases)
    width = max(1, max(len(c[2]) for c in cases))
    out = torch.full((n, width), -1, dtype=torch.int64)
    for i, c in enumerate(cases):
        out[i, : len(c[2])] = torch.tensor(c[2], dtype=torch.int64)
    store.sync(torch.device("cpu"), width)
    store.append(torch.arange(n), out, torch.tensor([len(c[2]) for c in cases]))
    store.history.note_step(np.arange(n), np.array([len(c[2]) for c in cases]))
    d = max(len(c[3]) for c in cases)
    before = np.full((n, max(d, 1)), -1, np.int64)
    for i, c in enumerate(cases):
        before[i, : len(c[3])] = c[3]
    view = RowsView(np.arange(n), np.array([len(c[3]) for c in cases]), np.full(n, -1, np.int64), before)
    batch = store.row_batch(view, torch.device("cpu"))
    l = logits[:, col_start:].clone()
    apply_processors(l, batch, col_start)
    return l


def test_dry_matches_llama_cpp_on_random_contexts_of_prompt_outputs_and_drafts():
    rng = random.Random(0)
    cases = [_random_case(rng) for _ in range(300)]
    logits = torch.randn(len(cases), V, generator=torch.Generator().manual_seed(1)) * 2
    got = _processed_rows(cases, logits)
    penalised = 0
    for i, (p, prompt, outputs, drafts) in enumerate(cases):
        want = llama_dry(logits[i].tolist(), prompt + outputs + drafts, p.dry_multiplier, p.dry_base,
                         p.dry_allowed_length, p.dry_penalty_last_n, p.dry_sequence_breakers or ())
        assert got[i].tolist() == [float(v) for v in want], (i, p, prompt, outputs, drafts)
        penalised += int((got[i] != logits[i]).any())
    assert 100 < penalised < 290          # both outcomes are common in the sample


def test_breakers_cut_repeats_and_one_token_breakers_are_never_penalised():
    # llama.cpp's example "a b c c b c y a b c": c, b, y follow copies of suffixes 3, 1, 2 long
    a, b, c, y = 1, 2, 3, 4
    context = [a, b, c, c, b, c, y, a, b, c]
    base = SP(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=1)
    cases = [(base, context, [], []),
             (SP(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=1, dry_sequence_breakers=[[a]]), context, [], []),
             (SP(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=1, dry_sequence_breakers=[[y, a]]),
              context, [], [])]
    got = _processed_rows(cases, torch.zeros(len(cases), V))
    # no breaker: c extends a repeat of 3 (2 ** 2), b of 1 (2 ** 0), y of 2 (2 ** 1)
    assert got[0, [c, b, y]].tolist() == [-4.0, -1.0, -2.0]
    # breaker "a" 2 tokens back: repeats cap at 2 (c: 2 ** 1); a itself is never penalised
    assert got[1, [c, b, y]].tolist() == [-2.0, -1.0, -2.0]
    # the two-token breaker "y a" ends 2 tokens back: the same cap
    assert got[2, [c, b, y]].tolist() == [-2.0, -1.0, -2.0]
    # a long run of one token: the exponent stops at llama.cpp's cap (100 ** 19, finite in fp32)
    run = _processed_rows([(SP(dry_multiplier=1.0, dry_base=100.0, dry_allowed_length=0), [5] * 30, [], [])],
                          torch.zeros(1, V))
    assert run[0, 5].item() == -float(np.float32(100.0 ** 19))
    for row, case in zip(got, cases):
        p = case[0]
        assert row.tolist() == [float(v) for v in llama_dry([0.0] * V, context, 1.0, 2.0, 1, -1,
                                                               p.dry_sequence_breakers or ())]


def test_dry_on_a_vocab_shard_equals_the_full_row_there():
    rng = random.Random(2)
    cases = [_random_case(rng) for _ in range(60)]
    logits = torch.randn(len(cases), V, generator=torch.Generator().manual_seed(3))
    full = _processed_rows(cases, logits)
    for start in (1, 5, 11):
        assert torch.equal(_processed_rows(cases, logits, start), full[:, start:])


@pytest.mark.parametrize("strategy", ["replicated", "vocab_parallel"])
def test_sampled_tokens_follow_the_reference_step_after_step(strategy):
    """Seeded requests over 6 steps: each row's token is the reference draw from the DRY-processed
    row, the context growing with the sampler's own outputs."""
    sampler = tpsample.Sampler(V, strategy=strategy, seed=0, auto_graph=False)
    rng = random.Random(4)
    params, prompts = [], []
    for i in range(12):
        p, prompt, _, _ = _random_case(rng)
        params.append(SP(**{**_fields(p), "temperature": 0.7, "seed": i, "top_k": 6}))
        prompts.append(prompt)
        sampler.add_request(str(i), params[-1], prompt)
    ids = [str(i) for i in range(12)]
    changed = 0
    for step in range(6):
        logits = torch.randn(12, V, generator=torch.Generator().manual_seed(10 + step)) * 2
        history = [sampler.output_token_ids(r) for r in ids]
        out = sampler.sample(logits.clone(), sampler.plan(ids))
        for i, p in enumerate(params):
            ctx = prompts[i] + history[i]
            row = [float(v) for v in llama_dry(logits[i].tolist(), ctx, p.dry_multiplier, p.dry_base,
                                               p.dry_allowed_length, p.dry_penalty_last_n,
                                               p.dry_sequence_breakers or ())]
            plain = SP(temperature=0.7, seed=i, top_k=6)
            want = ref.sample_row(row, plain, i, len(ctx), prompts[i], history[i])["token"]
            assert out.tokens(i) == [want], (step, i)
            changed += int(want != ref.sample_row(logits[i].tolist(), plain, i, len(ctx), prompts[i],
                                                  history[i])["token"])
    assert changed > 0                     # DRY changed some tokens


def _fields(p: SP) -> dict:
    return {k: getattr(p, k) for k in ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                                       "dry_sequence_breakers")}


@pytest.mark.parametrize("field,value", [("dry_multiplier", -0.1), ("dry_multiplier", 101.0), ("dry_base", 0.99),
                                         ("dry_allowed_length", -1), ("dry_penalty_last_n", -2),
                                         ("dry_sequence_breakers", [[]]), ("dry_sequence_breakers", [list(range(22))]),
                                         ("dry_sequence_breakers", [""]), ("dry_sequence_breakers", ["x" * 41])])
def test_bad_dry_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field} must be"):
        SP(**{field: value})


@pytest.mark.parametrize("breakers", [[[1, V]], ["\n"]])
def test_breaker_ids_outside_the_vocabulary_and_strings_are_refused_by_the_sampler(breakers):
    sampler = tpsample.Sampler(V)
    with pytest.raises(ValueError, match="dry_sequence_breakers"):
        sampler.add_request("a", SP(dry_multiplier=1.0, dry_sequence_breakers=breakers), [1])


def test_ops_apply_dry_matches_the_reference_on_full_rows_and_shards():
    from tpsample import ops
    rng = random.Random(5)
    cases = [_random_case(rng) for _ in range(40)]
    logits = torch.randn(len(cases), V, generator=torch.Generator().manual_seed(6))
    for i, (p, prompt, outputs, drafts) in enumerate(cases):
        context = prompt + outputs + drafts
        ctx = torch.tensor([context + [-1, -1]])
        kw = dict(multiplier=p.dry_multiplier, base=torch.tensor([p.dry_base]), allowed_length=p.dry_allowed_length,
                  penalty_last_n=p.dry_penalty_last_n, sequence_breakers=p.dry_sequence_breakers)
        want = llama_dry(logits[i].tolist(), context, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                         p.dry_penalty_last_n, p.dry_sequence_breakers or ())
        assert ops.apply_dry(logits[i: i + 1], ctx, **kw)[0].tolist() == [float(v) for v in want], i
        assert ops.apply_dry(logits[i: i + 1, 4:], ctx, col_start=4, **kw)[0].tolist() == [float(v) for v in want[4:]]


def test_long_contexts_sampled_in_row_chunks_match_the_reference():
    """2,000-token contexts: the rows go through the prefix doubling a few at a time."""
    rng = random.Random(7)
    cases = []
    for i in range(5):
        motif = [rng.randrange(V) for _ in range(rng.randrange(3, 40))]
        prompt = (motif * 200)[: 2000 - 7 * i]
        cases.append((SP(dry_multiplier=0.5, dry_base=1.001, dry_allowed_length=i, dry_penalty_last_n=(-1, 900)[i % 2],
                         dry_sequence_breakers=[[motif[0]]] if i == 3 else None), prompt, [], []))
    logits = torch.randn(len(cases), V, generator=torch.Generator().manual_seed(8))
    got = _processed_rows(cases, logits)
    for i, (p, prompt, _, _) in enumerate(cases):
        want = llama_dry(logits[i].tolist(), prompt, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                         p.dry_penalty_last_n, p.dry_sequence_breakers or ())
        assert got[i].tolist() == [float(v) for v in want], i
    assert int((got != logits).any(dim=1).sum()) >= 4          # rows were penalised
