"""Speculative decoding (issue 4): verification keeps every emitted token distributed as p.

One-hot drafts (n-gram style: fixed tokens, no draft_probs) are accepted iff they equal the token
plain decoding draws at their position, which is then emitted at a rejection: a seeded
request's tokens do not depend on the drafts at all. Drafts drawn from a given q (`draft_probs`)
take rejection sampling.

CPU, TP=1. Distribution tests put thousands of independent requests (seeds 0..N-1) in one
batch, all verifying the same rows, and test with chi-square at alpha = 0.001 (bins expecting
fewer than 20 counts pooled) that the first emitted token follows the target p of row 0 and
that the second, given the first draft was accepted, follows p of row 1; for one-hot drafts the
acceptance rate is tested against p(x) with a two-sided z-test at alpha = 0.001. p is the
softmax of the processed row, computed with the float64 reference's processors.
Exactness tests compare with `reference.sample_request` token for token.
"""
from __future__ import annotations

import math
import random
import zlib

import pytest
import reference as ref
import torch
from scenarios import grammar_rows

import tpsample
from tpsample import SamplingParams as SP

ALPHA = 1e-3
INF = float("inf")


def chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's chi-square p-value over bins with expected > 0; bins expecting < 20 pooled."""
    small = expected < 20
    obs = torch.cat([observed[~small], observed[small].sum().reshape(1)]).double()
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)]).double()
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    return float(torch.special.gammaincc(torch.tensor((obs.numel() - 1) / 2, dtype=torch.float64), stat / 2))


def assert_counts_fit(tokens: torch.Tensor, expected: torch.Tensor) -> None:
    """tokens follow the expected counts [V]: never a token expecting 0, chi-square above alpha."""
    counts = torch.bincount(tokens, minlength=expected.numel()).double()
    assert int(counts[expected == 0].sum()) == 0, "a token with target probability 0 was emitted"
    assert chi2_pvalue(counts, expected) > ALPHA


def target_p(row: torch.Tensor, params: SP, prompt: list[int], output: list[int]) -> torch.Tensor:
    """p = softmax of the processed row (reference processors, float64)."""
    proc = ref.filter_row(ref.process_row(row.double().tolist(), params, prompt, output, None, None), params)
    return torch.softmax(torch.tensor(proc, dtype=torch.float64), dim=0)


def spec_sampler(vocab: int, num_reqs: int, max_logits: int = 3, **kw) -> tpsample.Sampler:
    return tpsample.Sampler(vocab, max_num_reqs=num_reqs, max_num_logits_per_req=max_logits, seed=0,
                            strategy="replicated", **kw)


VOCAB = 12
DRAWS = 8000
TARGETS = {
    "plain": lambda s: SP(seed=s),
    "temperature_top_k": lambda s: SP(seed=s, temperature=0.7, top_k=6),
    "top_p_penalties": lambda s: SP(seed=s, top_p=0.85, repetition_penalty=1.4, presence_penalty=0.5),
}


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("draft", ["one_hot", "given_q"])
def test_emitted_tokens_are_distributed_as_the_target(draft, target):
    """First token ~ p0; second token given the first draft accepted ~ p1 (history = prompt + x0)."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{draft}/{target}".encode()))
    rows = torch.randn(3, VOCAB, generator=gen) * 1.5              # draft row 0, draft row 1, bonus row
    prompt = [int(rows[0].argmax()), 5]
    params = [TARGETS[target](s) for s in range(DRAWS)]
    p0 = target_p(rows[0], params[0], prompt, [])
    if draft == "one_hot":
        # x0 likely enough to give ~thousands of second tokens; x1 fixed too
        x0 = torch.full((DRAWS,), int(torch.argsort(p0, descending=True)[1]))
        x1 = torch.full((DRAWS,), int(torch.argsort(p0)[0]))            # an unlikely (maybe dropped) token
        draft_probs = None
    else:
        q = torch.softmax(rows + torch.randn(3, VOCAB, generator=gen), dim=1)      # a draft model near p
        q[:2, 0] = 0.0                                                    # q may miss tokens p has
        q = q / q.sum(dim=1, keepdim=True)
        x0 = torch.multinomial(q[0], DRAWS, replacement=True, generator=gen)
        x1 = torch.multinomial(q[1], DRAWS, replacement=True, generator=gen)
        draft_probs = q.repeat(DRAWS, 1)                                  # rows request by request
    sampler = spec_sampler(VOCAB, DRAWS)
    ids = [f"r{s}" for s in range(DRAWS)]
    for r, p in zip(ids, params):
        sampler.add_request(r, p, prompt)
    plan = sampler.plan(ids, draft_token_ids=torch.stack([x0, x1], dim=1).tolist())
    out = sampler.sample(rows.repeat(DRAWS, 1), plan, draft_probs=draft_probs)
    first = out.sampled_token_ids[:, 0]
    assert_counts_fit(first, DRAWS * p0)
    accepted0 = out.num_sampled >= 2
    assert torch.equal(accepted0, first == x0)                # x0 is emitted iff it was accepted
    # Given x0 accepted, the second token follows p1 with x0 in the history. Under given_q x0
    # varies, so the expected counts are the sum over x0 groups (a sum of multinomials: the
    # chi-square test is then conservative).
    assert int(accepted0.sum()) >= 1000
    expected = sum(int((x0[accepted0] == tok).sum()) * target_p(rows[1], params[0], prompt, [tok])
                   for tok in x0[accepted0].unique().tolist())
    assert_counts_fit(out.sampled_token_ids[accepted0, 1], expected)
    if draft == "one_hot":
        n, p = DRAWS, float(p0[x0[0]])
        z = (int(accepted0.sum()) - n * p) / math.sqrt(n * p * (1 - p))
        assert abs(z) < 3.29                                    # acceptance rate = p0(x0), alpha = 0.001


def test_greedy_verification_accepts_while_the_draft_is_the_argmax():
    vocab, num_drafts = 60, 3
    sampler = spec_sampler(vocab, 64, max_logits=num_drafts + 1)
    ids = [f"g{i}" for i in range(40)]
    drafts, want = [], []
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(len(ids) * (num_drafts + 1), vocab, generator=gen) * 3
    for i, r in enumerate(ids):
        sampler.add_request(r, SP(temperature=0.0, seed=i), [1])
        best = logits[i * (num_drafts + 1): (i + 1) * (num_drafts + 1)].argmax(dim=1).tolist()
        mismatch = i % (num_drafts + 1)                           # first wrong draft (3 = none)
        d = [best[j] if j < mismatch else (best[j] + 1) % vocab for j in range(num_drafts)]
        drafts.append(d)
        want.append(best[: mismatch + 1])
    out = sampler.sample(logits, sampler.plan(ids, draft_token_ids=drafts))
    assert [out.tokens(i) for i in range(len(ids))] == want
    assert out.num_rejected.tolist() == [num_drafts - (len(w) - 1) for w in want]


def random_params(rng: random.Random, vocab: int, i: int) -> SP:
    kw = {"temperature": rng.choice([0.0, 0.5, 1.0]), "seed": i}
    for p, key, value in ((0.4, "top_k", rng.choice([2, 10, 50])), (0.4, "top_p", rng.choice([0.5, 0.9])),
                          (0.3, "min_p", 0.05), (0.4, "repetition_penalty", rng.choice([0.8, 1.5])),
                          (0.4, "frequency_penalty", rng.uniform(-1, 2)), (0.4, "presence_penalty", rng.uniform(-1, 2)),
                          (0.3, "min_tokens", rng.randint(1, 6)), (0.4, "stop_token_ids", [0, 1, 2]),
                          (0.4, "bad_words_token_ids", [[rng.randrange(8), rng.randrange(8)], [rng.randrange(8)]]),
                          (0.3, "logit_bias", {rng.randrange(8): rng.uniform(-3, 3)}),
                          (0.4, "logprobs", rng.choice([0, 3])), (0.3, "logprobs_mode", "processed")):
        if rng.random() < p:
            kw[key] = value
    return SP(**kw)


def test_spec_tokens_match_reference_and_outputs_are_consistent():
    """48 requests with 0-3 one-hot drafts (mostly the row's argmax, so often accepted),
    6 steps, grammar rows in some: tokens, logprobs and counts equal reference.sample_request,
    and histories hold exactly the emitted tokens."""
    vocab, max_drafts = 211, 3
    rng = random.Random(2)
    sampler = spec_sampler(vocab, 64, max_logits=max_drafts + 1, eos_token_id=3, max_logprobs=5)
    ids = [f"s{i}" for i in range(48)]
    for i, r in enumerate(ids):
        sampler.add_request(r, random_params(rng, vocab, i), [rng.randrange(8) for _ in range(3)])
    emitted = {r: [] for r in ids}
    for step in range(6):
        counts = [i % (max_drafts + 1) for i in range(len(ids))]
        num_rows = sum(1 + n for n in counts)
        x = torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(step)) * 3
        x[:, :8] += 8.0                                  # a few likely tokens, often repeated
        best, start, drafts = x.argmax(dim=1).tolist(), 0, []
        for n in counts:                                 # mostly the row's argmax: often accepted
            drafts.append([best[start + j] if rng.random() < 0.8 else rng.randrange(8) for j in range(n)])
            start += 1 + n
        mask = grammar_rows(num_rows, vocab, step) if step % 3 == 2 else None
        states = [sampler.slots.get(r) for r in ids]
        history = [list(st.output_token_ids) for st in states]
        plan = sampler.plan(ids, draft_token_ids=drafts, grammar_bitmask=mask)
        out = sampler.sample(x, plan)
        assert tuple(out.sampled_token_ids.shape) == (len(ids), max(len(d) for d in drafts) + 1)
        for i, st in enumerate(states):
            rows = range(plan.row_start[i], plan.row_start[i] + plan.rows_per_req[i])
            bits = None if mask is None else [ref.unpack_bitmask(mask[j], vocab) for j in rows]
            want, results = ref.sample_request([x[j].double().tolist() for j in rows], st.params, st.seed,
                                               st.prompt_token_ids, history[i], drafts[i], 3, bits)
            got = out.tokens(i)
            assert got == want, (st.req_id, step)
            n = int(out.num_sampled[i])
            assert n + int(out.num_rejected[i]) == 1 + len(drafts[i])
            assert got[: n - 1] == drafts[i][: n - 1]
            assert bool((out.sampled_token_ids[i, n:] == -1).all())
            assert int(out.num_nans[i]) == 0 and int(out.num_fallback[i]) == 0
            for j, res in enumerate(results):
                if st.params.logprobs is not None:
                    lp_ids, lp_vals, rank = res["logprobs"]
                    row = plan.row_start[i] + j
                    assert out.logprobs.token_ids[row, : len(lp_ids)].tolist() == lp_ids
                    assert torch.allclose(out.logprobs.logprobs[row, : len(lp_vals)].double(),
                                          torch.tensor(lp_vals, dtype=torch.float64), atol=1e-5, rtol=0)
                    assert int(out.logprobs.ranks[row]) == rank
            emitted[st.req_id] += got
    assert {r: sampler.slots.get(r).output_token_ids for r in ids} == emitted
    num_accepted = sum(len(e) for e in emitted.values()) - 6 * len(ids)
    assert num_accepted > 50                                   # the multi-row paths were exercised


def test_requests_without_drafts_are_unaffected_by_spec_neighbours():
    vocab = 97
    plain = [SP(seed=10 + i, top_k=20, frequency_penalty=0.5) for i in range(6)] + [SP(temperature=0.0)]

    def run(with_spec: bool) -> list[list[int]]:
        sampler = spec_sampler(vocab, 16, max_logits=3 if with_spec else 1)
        for i, p in enumerate(plain):
            sampler.add_request(f"p{i}", p, [i])
        ids = [f"p{i}" for i in range(len(plain))]
        if with_spec:
            for i in range(5):
                sampler.add_request(f"s{i}", SP(seed=90 + i), [7])
            ids = [r for pair in zip(ids, [f"s{i}" for i in range(5)]) for r in pair] + ids[5:]
        tokens = []
        for step in range(4):
            drafts = [[step, 3] if r[0] == "s" else [] for r in ids] if with_spec else None
            rows = {r: torch.randn(3 if r[0] == "s" else 1, vocab, generator=torch.Generator().manual_seed(
                zlib.crc32(f"{r}/{step}".encode()))) for r in ids}
            out = sampler.sample(torch.cat([rows[r] for r in ids]), sampler.plan(ids, draft_token_ids=drafts))
            tokens.append([out.tokens(ids.index(f"p{i}")) for i in range(len(plain))])
        return tokens

    assert run(True) == run(False)


def test_histories_advance_by_emitted_tokens_only():
    """Rejected drafts never enter the history: penalties, bad words and positions in the next
    step see exactly the emitted tokens."""
    vocab = 50
    a, b, c, d, z, y = 10, 11, 12, 13, 20, 21
    sampler = spec_sampler(vocab, 4, eos_token_id=None)
    sampler.add_request("pen", SP(temperature=0.0, presence_penalty=2.0), [1])
    sampler.add_request("bad", SP(temperature=0.0, bad_words_token_ids=[[a, z]]), [1])
    sampler.add_request("pos", SP(seed=5, top_k=5), [1])
    step1 = torch.zeros(9, vocab)
    step1[0, a] = step1[1, c] = step1[2, d] = 5.0            # pen: accept a, reject b (argmax c)
    step1[3, a] = 5.0                                         # bad: accept a ...
    step1[4, [z, y]] = torch.tensor([5.0, 4.0])               # ... z banned after a: reject z, emit y
    step1[6:9] = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    drafts = [[a, b], [a, z], [int(step1[6].argmax()), 0]]
    out = sampler.sample(step1, sampler.plan(["pen", "bad", "pos"], draft_token_ids=drafts))
    assert out.tokens(0) == [a, c] and out.tokens(1) == [a, y]
    assert out.num_rejected.tolist()[:2] == [1, 1]
    step2 = torch.zeros(3, vocab)
    step2[0, [a, b, c, d]] = torch.tensor([5.0, 4.9, 4.8, 3.5])   # a, c penalised; b (rejected) is not
    step2[1, [a, z]] = torch.tensor([1.0, 5.0])                    # last output y: z is allowed again
    step2[2] = torch.randn(vocab, generator=torch.Generator().manual_seed(1))
    st = sampler.slots.get("pos")
    history = list(st.output_token_ids)
    assert history == out.tokens(2)
    out2 = sampler.sample(step2, sampler.plan(["pen", "bad", "pos"]))
    assert out2.tokens(0) == [b] and out2.tokens(1) == [z]
    want = ref.sample_row(step2[2].double().tolist(), st.params, 5, 1 + len(history), [1], history)
    assert out2.tokens(2) == [want["token"]]                  # drawn at position prompt + emitted


def test_num_fallback_counts_only_rows_that_emitted():
    """A guarded row after the first rejection is never reached: it is not counted."""
    sampler = spec_sampler(16, 2)
    sampler.add_request("a", SP(temperature=0.0), [1])
    sampler.add_request("b", SP(temperature=0.0), [1])
    x = torch.zeros(6, 16)
    x[0, 5] = x[3, 5] = 3.0                   # a: draft 7 rejected at row 0; b: draft 5 accepted
    x[1] = x[4] = -INF                        # nothing finite: a never reaches it, b does
    out = sampler.sample(x, sampler.plan(["a", "b"], draft_token_ids=[[7, 2], [5, 2]]))
    assert out.tokens(0) == [5] and out.num_fallback.tolist() == [0, 1]
    assert out.tokens(1) == [5, 0]                        # the guard's token 0 ends b's step


def test_one_hot_draft_acceptance_rate_is_the_target_probability():
    """P(accept x) = p(x) for drafts of high, middling and low probability, and for a draft the
    filters dropped (p = 0: never accepted). 4000 seeds per draft; two-sided z-test per draft
    at alpha = 0.001 / 3 (Bonferroni over the three drafts with p > 0)."""
    n = 4000
    row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(11)) * 1.5
    params = SP(seed=0, temperature=0.8, top_k=8)
    p = target_p(row, params, [1], [])
    order = torch.argsort(p, descending=True).tolist()
    xs = [order[0], order[2], order[7], order[-1]]            # order[-1] is outside the top 8
    sampler = spec_sampler(VOCAB, n * len(xs), max_logits=2)
    ids = [f"r{s}" for s in range(n * len(xs))]
    for s, r in enumerate(ids):
        sampler.add_request(r, SP(seed=s, temperature=0.8, top_k=8), [1])
    drafts = [[x] for x in xs for _ in range(n)]
    out = sampler.sample(row.repeat(2 * len(ids), 1), sampler.plan(ids, draft_token_ids=drafts))
    accepted = (out.num_sampled == 2).view(len(xs), n)
    for k, x in enumerate(xs):
        px, got = float(p[x]), int(accepted[k].sum())
        if px == 0:
            assert got == 0
            continue
        z = (got - n * px) / math.sqrt(n * px * (1 - px))
        assert abs(z) < 3.59, (x, px, got / n)                # 3.59: two-sided alpha 0.001 / 3


def _toy_row(req: str, pos: int, prev: int, vocab: int) -> torch.Tensor:
    """A stand-in model: logits that depend only on the request, the position and the token before."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{req}/{pos}/{prev}".encode()))
    row = torch.randn(vocab, generator=gen) * 3
    row[:8] += 4.0                                           # a few likely tokens: drafts hit often
    return row


def _decode(params: dict, prompt: list[int], length: int, vocab: int, drafts_for) -> dict:
    """Each request's first `length` tokens, verifying drafts_for(req, output so far) each step."""
    sampler = spec_sampler(vocab, len(params), max_logits=4, eos_token_id=3, max_logprobs=5)
    for r, p in params.items():
        sampler.add_request(r, p, prompt)
    out = {r: [] for r in params}
    while active := [r for r in params if len(out[r]) < length]:
        drafts = [drafts_for(r, out[r]) for r in active]
        rows = []
        for r, d in zip(active, drafts, strict=True):
            hist, base = prompt + out[r] + d, len(prompt) + len(out[r])
            rows += [_toy_row(r, base + j, hist[base + j - 1], vocab) for j in range(1 + len(d))]
        res = sampler.sample(torch.stack(rows), sampler.plan(active, draft_token_ids=drafts))
        for i, r in enumerate(active):
            out[r] += res.tokens(i)
    return {r: t[:length] for r, t in out.items()}


def test_seeded_tokens_equal_plain_decoding_whatever_the_drafts():
    """One-hot drafts change which rows are verified, never a token: random drafts (often the
    plain token, else any token), with penalties, filters, bad words and min_tokens, give
    exactly the plain tokens, greedy and sampled alike."""
    vocab, length, prompt = 50, 14, [4, 5, 6]
    rng = random.Random(5)
    params = {f"q{i}": random_params(rng, vocab, i) for i in range(32)}
    plain = _decode(params, prompt, length, vocab, lambda r, o: [])

    def drafts_for(r: str, o: list[int]) -> list[int]:
        n = min(rng.randint(0, 3), length - len(o) - 1)
        return [plain[r][len(o) + j] if rng.random() < 0.6 else rng.randrange(vocab) for j in range(n)]

    assert _decode(params, prompt, length, vocab, drafts_for) == plain


def test_one_hot_draft_probs_rows_verify_like_ngram_drafts():
    """A draft_probs row that is one-hot at its draft token is a deterministic draft: the same
    tokens as giving no draft probabilities."""
    vocab, n = 30, 300
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3 * n, vocab, generator=gen) * 2
    drafts = torch.randint(0, vocab, (n, 2), generator=gen)
    drafts[::2, 0] = x[0::3][::2].argmax(dim=1)              # likely drafts: some accepted
    q = torch.full((3 * n, vocab), 1.0 / vocab)              # the bonus rows' q is never read
    q[0::3] = torch.nn.functional.one_hot(drafts[:, 0], vocab).float()
    q[1::3] = torch.nn.functional.one_hot(drafts[:, 1], vocab).float()

    def run(draft_probs):
        sampler = spec_sampler(vocab, n)
        ids = [f"h{i}" for i in range(n)]
        for i, r in enumerate(ids):
            sampler.add_request(r, SP(seed=i, top_p=0.95) if i % 5 else SP(temperature=0.0), [1])
        out = sampler.sample(x, sampler.plan(ids, draft_token_ids=drafts.tolist()), draft_probs=draft_probs)
        return [out.tokens(i) for i in range(n)]

    with_q = run(q)
    assert with_q == run(None)
    assert sum(len(t) > 1 for t in with_q) > 20
