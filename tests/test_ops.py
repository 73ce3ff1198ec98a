"""`tpsample.ops` on the CPU torch path: the Sampler's tokens, logprobs and processors bit for bit,
batch invariance, argument checks, and the torch.library ops under torch.compile."""
from __future__ import annotations

import pytest
import torch

import tpsample
from tpsample import SamplingParams as SP
from tpsample import ops
from tpsample.noise import seed_to_int64

V = 301
NEG_INF = float("-inf")
# mixed rows: greedy, temperature only, top-k, top-p, min-p, their combinations, top-k >= V
PARAMS = [SP(temperature=0.0), SP(temperature=0.8, seed=11), SP(temperature=1.0, top_k=5, seed=12),
          SP(temperature=0.9, top_p=0.8, seed=13), SP(temperature=1.2, min_p=0.05, seed=14),
          SP(temperature=0.7, top_k=40, top_p=0.9, min_p=0.01, seed=2**64 - 3), SP(temperature=1.0, top_k=V, seed=16),
          SP(temperature=0.0, top_k=3, top_p=0.5)]
PROMPT_LENS = [3, 1, 7, 4, 2, 5, 6, 3]


def logits_at(step: int, rows: int, vocab: int = V, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + step)
    return torch.randn(rows, vocab, generator=g) * 3


def per_row(params, prompt_lens, step: int) -> dict:
    """The ops' per-row arguments of these requests at this decode step."""
    return dict(temperature=torch.tensor([p.temperature for p in params]),
                top_k=torch.tensor([p.top_k for p in params]),
                top_p=torch.tensor([p.top_p for p in params], dtype=torch.float64),
                min_p=torch.tensor([p.min_p for p in params]),
                seeds=torch.tensor([seed_to_int64(p.seed or 0) for p in params]),
                positions=torch.tensor(prompt_lens) + step)


def sampler_run(params, prompt_lens, steps: int, logits_fn, **plan_kw):
    """Per step the Sampler's SamplerOutput (requests with explicit seeds; unseeded ones greedy)."""
    s = tpsample.Sampler(V, seed=7)
    ids = [f"r{i}" for i in range(len(params))]
    for i, (p, n) in enumerate(zip(params, prompt_lens)):
        s.add_request(ids[i], p, list(range(1, n + 1)))
    outs = []
    for step in range(steps):
        plan = s.plan(ids, **plan_kw)
        outs.append(s.sample(logits_fn(step), plan))
    return outs


def special_rows(step: int) -> torch.Tensor:
    """Logits with NaNs, a row with nothing finite (the guard) and +inf entries."""
    x = logits_at(step, len(PARAMS))
    x[1, ::7] = float("nan")
    if step == 1:
        x[3] = NEG_INF
    x[2, 17] = float("inf")
    return x


def test_ops_sample_matches_the_sampler_bitwise():
    for logits_fn in (special_rows, lambda step: logits_at(step, len(PARAMS)).to(torch.bfloat16)):
        want = sampler_run(PARAMS, PROMPT_LENS, 4, logits_fn)
        for step, w in enumerate(want):
            got = ops.sample(logits_fn(step), **per_row(PARAMS, PROMPT_LENS, step))
            assert got.token_ids.tolist() == w.sampled_token_ids[:, 0].tolist(), step
            assert got.num_nans.tolist() == w.num_nans.tolist()
            assert got.fallback.tolist() == [bool(f) for f in w.num_fallback.tolist()]
    assert any(w.num_fallback.any() for w in sampler_run(PARAMS, PROMPT_LENS, 2, special_rows))


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_ops_logprobs_match_the_sampler_bitwise(mode):
    params = [SP(**{**p.__dict__, "logprobs": 3, "logprobs_mode": mode, "seed": p.seed}) for p in PARAMS]
    want = sampler_run(params, PROMPT_LENS, 2, special_rows)
    for step, w in enumerate(want):
        got = ops.sample(special_rows(step), logprobs=3, logprobs_mode=mode, **per_row(PARAMS, PROMPT_LENS, step))
        assert got.token_ids.tolist() == w.sampled_token_ids[:, 0].tolist()
        for name in ("token_ids", "logprobs", "ranks"):
            assert torch.equal(getattr(got.logprobs, name), getattr(w.logprobs, name)), (step, name)


def test_tokens_do_not_depend_on_row_order_or_batch():
    x = logits_at(0, len(PARAMS))
    rows = per_row(PARAMS, PROMPT_LENS, 2)
    full = ops.sample(x, **rows).token_ids
    perm = torch.randperm(len(PARAMS), generator=torch.Generator().manual_seed(3))
    permuted = ops.sample(x[perm], **{k: v[perm] for k, v in rows.items()}).token_ids
    assert permuted.tolist() == full[perm].tolist()
    for i in range(len(PARAMS)):
        alone = ops.sample(x[i:i + 1], **{k: v[i:i + 1] for k, v in rows.items()}).token_ids
        assert alone.tolist() == [full[i].item()]


def test_scalars_broadcast_like_per_row_tensors():
    x = logits_at(1, 5)
    seeds = torch.tensor([1, 2, 3, 4, 5])
    a = ops.sample(x, temperature=0.9, top_k=20, top_p=0.8, min_p=0.02, seeds=seeds, positions=9).token_ids
    b = ops.sample(x, temperature=torch.full((5,), 0.9), top_k=torch.full((5,), 20), top_p=torch.full((5,), 0.8),
                   min_p=torch.full((5,), 0.02), seeds=seeds, positions=torch.full((5,), 9)).token_ids
    assert a.tolist() == b.tolist()
    # the noise is keyed by (seed, position): other positions draw other tokens
    others = [ops.sample(x, temperature=0.9, seeds=seeds, positions=p).token_ids.tolist() for p in range(4)]
    assert len({tuple(o) for o in others}) > 1
    # a Python seed is taken mod 2**64, as SamplingParams' seed is
    assert ops.sample(x, temperature=1.0, seeds=-1, positions=0).token_ids.tolist() == \
        ops.sample(x, temperature=1.0, seeds=2**64 - 1, positions=0).token_ids.tolist()


BAD = [
    (dict(temperature=-0.5), "temperature must be 0 (greedy) or in [1e-06"),
    (dict(temperature=torch.tensor([1.0, 1e-9, 1.0])), "temperature[1] must be"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_p=torch.tensor([1.5, 1.0, 1.0])), "top_p[0]"),
    (dict(top_k=-2), "top_k must be -1 or 0 (off)"),
    (dict(top_k=2.5), "top_k must be a scalar or a 1-D tensor"),
    (dict(top_k=torch.tensor([1.0, 2.0, 3.0])), "top_k must be an integer tensor"),
    (dict(min_p=1.5), "min_p must be 0 (off) or in [2**-126, 1]"),
    (dict(seeds=torch.tensor([1.0, 2.0, 3.0])), "seeds must be an integer tensor"),
    (dict(seeds=True), "seeds must be a scalar"),
    (dict(positions=torch.tensor([0, -1, 0])), "positions[1] must be integers >= 0"),
    (dict(positions=torch.zeros(4, dtype=torch.int64)), "length rows = 3"),
    (dict(logprobs=-1), "logprobs must be None or an integer in [0, 65536]"),
    (dict(logprobs_mode="sorted"), "logprobs_mode must be one of"),
    (dict(strategy="fastest"), "strategy must be one of"),
    (dict(vocab_size=500), "logits must be this rank's shard of V = 500"),
    (dict(bitmask=torch.zeros(3, 9, dtype=torch.int64)), "bitmask must be None or an int32 tensor"),
    (dict(group="tp"), "group must be None, a torch.distributed ProcessGroup"),
    (dict(validate=1), "validate must be True or False"),
]


@pytest.mark.parametrize("bad,message", BAD, ids=[m.split(" must")[0] for _, m in BAD])
def test_bad_arguments_raise_value_errors_naming_the_argument(bad, message):
    args = dict(temperature=1.0, seeds=1, positions=0)
    args.update(bad)
    with pytest.raises(ValueError) as err:
        ops.sample(torch.zeros(3, V), **args)
    assert message in str(err.value) and "tpsample.ops.sample" in str(err.value)


def test_bad_logits_and_processor_arguments_raise():
    for logits, message in ((torch.zeros(V), "logits must be a 2-D floating-point"),
                            (torch.zeros(2, V, dtype=torch.int64), "logits must be a 2-D floating-point")):
        with pytest.raises(ValueError, match=message):
            ops.sample(logits, temperature=1.0, seeds=1, positions=0)
    x = torch.zeros(2, V)
    with pytest.raises(ValueError, match="repetition must be in"):
        ops.apply_penalties(x, output_token_ids=torch.zeros(2, 1, dtype=torch.int64), repetition=0.0)
    with pytest.raises(ValueError, match="output_token_ids must be token ids >= 0"):
        ops.apply_penalties(x, output_token_ids=torch.full((2, 1), -5))
    with pytest.raises(ValueError, match=r"values must be in \[-100, 100\]"):
        ops.apply_bias(x, torch.zeros(2, 1, dtype=torch.int64), torch.full((2, 1), 1e9))
    with pytest.raises(ValueError, match="bitmask must be an int32 tensor"):
        ops.apply_bitmask(x, torch.zeros(2, 10, dtype=torch.int64))
    with pytest.raises(ValueError, match="bitmask must be at least"):
        ops.apply_bitmask(x, torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"token_ids must be token ids in \[0, 301\)"):
        ops.logprobs(x, torch.tensor([0, V]))


def padded(lists, width=None) -> torch.Tensor:
    width = max(1, max((len(x) for x in lists), default=0)) if width is None else width
    out = torch.full((len(lists), width), -1, dtype=torch.int64)
    for i, x in enumerate(lists):
        out[i, :len(x)] = torch.tensor(x, dtype=torch.int64)
    return out


PEN = [SP(temperature=0.9, seed=21, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3),
       SP(temperature=0.0, repetition_penalty=1.6),
       SP(temperature=1.0, seed=22, frequency_penalty=-0.7, logit_bias={5: 4.0, 9: -3.0}),
       SP(temperature=0.8, top_k=10, seed=23, presence_penalty=1.5),
       SP(temperature=0.0, frequency_penalty=1.0), SP(temperature=0.0, presence_penalty=2.0)]
PEN_PROMPTS = [[10, 11, 12, 10], [11, 13], [12], [14, 15, 14], [1], [2, 3]]


def repeating(step: int) -> torch.Tensor:
    """The same rows every step plus a little noise: without penalties a greedy row repeats its
    token, so each penalty decides tokens (the frequency row's second repeat, too)."""
    x = logits_at(0, len(PEN), seed=4) + 0.3 * logits_at(step + 1, len(PEN), seed=5)
    x[:, 10:16] += 6.0
    return x


def test_processors_then_sample_give_the_sampler_tokens():
    s = tpsample.Sampler(V, seed=7)          # sampler_run's prompts are 1..n: use the real ones here
    ids = [f"r{i}" for i in range(len(PEN))]
    for i, p in enumerate(PEN):
        s.add_request(ids[i], p, PEN_PROMPTS[i])
    history = [[] for _ in PEN]
    bias_ids = padded([list(p.logit_bias or {}) for p in PEN])
    bias_vals = torch.zeros(bias_ids.shape)
    for i, p in enumerate(PEN):
        bias_vals[i, :len(p.logit_bias or {})] = torch.tensor(list((p.logit_bias or {}).values()))
    rows = dict(temperature=torch.tensor([p.temperature for p in PEN]), top_k=torch.tensor([p.top_k for p in PEN]),
                seeds=torch.tensor([p.seed or 0 for p in PEN]))
    for step in range(8):
        x = repeating(step)
        w = s.sample(x, s.plan(ids)).sampled_token_ids[:, 0].tolist()
        l = ops.apply_bias(x, bias_ids, bias_vals)
        l = ops.apply_penalties(l, output_token_ids=padded(history), prompt_token_ids=padded(PEN_PROMPTS),
                                repetition=torch.tensor([p.repetition_penalty for p in PEN]),
                                frequency=torch.tensor([p.frequency_penalty for p in PEN]),
                                presence=torch.tensor([p.presence_penalty for p in PEN]))
        got = ops.sample(l, positions=torch.tensor([len(p) + step for p in PEN_PROMPTS]), **rows).token_ids.tolist()
        assert got == w, step
        for h, t in zip(history, got):
            h.append(t)
    assert any(len(set(h)) < len(h) for h in history)      # some token repeated: frequency counted it


def grammar(rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = (V + 31) // 32
    mask = torch.randint(-2**31, 2**31 - 1, (rows, words), generator=g, dtype=torch.int64).to(torch.int32)
    mask[0] = -1                          # unconstrained
    mask[1] = 0
    mask[1, 0] = 1 << 4                   # only token 4 allowed
    return mask


def test_bitmask_in_sample_and_apply_bitmask_follow_the_sampler_grammar():
    mask = grammar(len(PARAMS), 5)
    want = sampler_run(PARAMS, PROMPT_LENS, 3, special_rows, grammar_bitmask=mask)
    for step, w in enumerate(want):
        rows = per_row(PARAMS, PROMPT_LENS, step)
        got = ops.sample(special_rows(step), bitmask=mask, **rows)
        assert got.token_ids.tolist() == w.sampled_token_ids[:, 0].tolist()
        assert got.num_nans.tolist() == w.num_nans.tolist()
        assert got.token_ids[1].item() == 4
        masked = ops.sample(ops.apply_bitmask(special_rows(step), mask), **rows)
        kept = ~masked.fallback
        assert masked.token_ids[kept].tolist() == got.token_ids[kept].tolist()


def test_logprobs_op_gives_the_sampler_raw_logprobs():
    params = [SP(**{**p.__dict__, "logprobs": 4}) for p in PARAMS]
    want = sampler_run(params, PROMPT_LENS, 2, special_rows)
    for step, w in enumerate(want):
        got = ops.logprobs(special_rows(step), w.sampled_token_ids[:, 0], 4)
        for name in ("token_ids", "logprobs", "ranks"):
            assert torch.equal(getattr(got, name), getattr(w.logprobs, name)), name


def test_verify_drafts_accepts_iff_a_draft_is_the_plain_token():
    params, lens = PARAMS[:5], PROMPT_LENS[:5]
    counts = [2, 0, 1, 2, 1]
    starts = [sum(counts[:i]) + i for i in range(len(params))]        # each request: drafts, then its bonus row
    rows = sum(counts) + len(params)
    x = logits_at(9, rows)
    per = per_row(params, lens, 0)

    def expand(t):          # a request's value on each of its rows
        return torch.repeat_interleave(t, torch.tensor(counts) + 1)

    offsets = torch.cat([torch.arange(c + 1) for c in counts])
    plain = ops.sample(x, **{k: expand(v) for k, v in per.items() if k != "positions"},
                       positions=expand(per["positions"]) + offsets).token_ids.tolist()
    drafts = [[plain[s + j] if (i + j) % 2 == 0 else (plain[s + j] + 1) % V for j in range(c)]
              for i, (s, c) in enumerate(zip(starts, counts))]
    got = ops.verify_drafts(x, drafts, **per)
    s = tpsample.Sampler(V, seed=7, max_num_logits_per_req=3)
    ids = [f"r{i}" for i in range(len(params))]
    for i, (p, n) in enumerate(zip(params, lens)):
        s.add_request(ids[i], p, list(range(1, n + 1)))
    w = s.sample(x, s.plan(ids, draft_token_ids=drafts))
    assert got.token_ids.tolist() == w.sampled_token_ids.tolist()
    assert got.num_sampled.tolist() == w.num_sampled.tolist()
    for i, (st, d) in enumerate(zip(starts, drafts)):       # accepted prefix, then the plain token
        k = next((j for j, t in enumerate(d) if t != plain[st + j]), len(d))
        assert got.token_ids[i, :k + 1].tolist() == d[:k] + [plain[st + k]]
        assert got.num_sampled[i].item() == k + 1
    assert 0 < got.num_rejected.sum().item() < sum(counts)


def test_verify_drafts_with_draft_probs_gives_the_sampler_tokens():
    params, lens, drafts = PARAMS[1:5], PROMPT_LENS[1:5], [[3, 7], [11], [], [2, 2]]
    rows = sum(len(d) for d in drafts) + len(drafts)
    x = logits_at(11, rows)
    q = torch.softmax(logits_at(12, rows), dim=1)
    q[0] = 0.0
    q[0, 3] = 1.0                         # a one-hot row: verified as a deterministic draft
    got = ops.verify_drafts(x, drafts, draft_probs=q, **per_row(params, lens, 0))
    s = tpsample.Sampler(V, seed=7, max_num_logits_per_req=3)
    ids = [f"r{i}" for i in range(len(params))]
    for i, (p, n) in enumerate(zip(params, lens)):
        s.add_request(ids[i], p, list(range(1, n + 1)))
    w = s.sample(x, s.plan(ids, draft_token_ids=drafts), draft_probs=q)
    assert got.token_ids.tolist() == w.sampled_token_ids.tolist()
    assert got.num_rejected.tolist() == w.num_rejected.tolist()


def test_ops_compile_fullgraph():
    """torch.compile(fullgraph=True) over the processors and sample (backend aot_eager: it traces
    through the fake implementations without compiling C++, which inductor does in ~40 s here)."""
    def step(x, t, k, seeds, pos, hist):
        l = ops.apply_penalties(x, output_token_ids=hist, repetition=1.3, frequency=0.2)
        out = ops.sample(l, temperature=t, top_k=k, top_p=0.9, seeds=seeds, positions=pos, logprobs=2)
        return out.token_ids, out.logprobs.logprobs, out.fallback

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for i in range(2):
        args = (logits_at(i, 6), torch.tensor([0.0, 0.7, 1.0, 1.0, 0.5, 1.3]), torch.tensor([0, 5, -1, 40, 2, 0]),
                torch.arange(6) * 3, torch.arange(6) + i, torch.randint(0, V, (6, 4 + i)))
        for a, b in zip(compiled(*args), step(*args)):
            assert torch.equal(a, b)


def test_custom_ops_pass_torch_library_opcheck():
    x = logits_at(0, 4)
    t, k, p, m = torch.tensor([0.0, 1.0, 0.8, 1.1]), torch.tensor([0, 3, 0, 0]), torch.full((4,), 0.9), torch.zeros(4)
    seeds, pos = torch.arange(4), torch.full((4,), 5)
    torch.library.opcheck(torch.ops.tpsample.sample.default, (x, t, k, p, m, seeds, pos, None, 2, False, -1))
    hist = torch.randint(-1, V, (4, 3))
    torch.library.opcheck(torch.ops.tpsample.apply_penalties.default, (x, hist, hist, t + 1, t, t, 0))
    torch.library.opcheck(torch.ops.tpsample.apply_bias.default, (x, hist, hist.float(), 0))
    torch.library.opcheck(torch.ops.tpsample.apply_bitmask.default, (x, grammar(4, 1), 0))
    torch.library.opcheck(torch.ops.tpsample.logprobs.default, (x, seeds, 3, 0))


@pytest.mark.gpu
def test_ops_sample_replays_from_a_cuda_graph():
    dev = torch.device("cuda")
    rows = 16
    x = torch.randn(rows, 32000, device=dev) * 3
    t = torch.linspace(0, 1.2, rows, device=dev)
    k = torch.tensor([0, 50] * (rows // 2), device=dev)
    seeds = torch.arange(rows, device=dev)
    pos = torch.full((rows,), 7, dtype=torch.int64, device=dev)

    def call():
        return ops.sample(x, temperature=t, top_k=k, top_p=0.9, seeds=seeds, positions=pos, logprobs=3)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for step in range(3):
        x.copy_(torch.randn(rows, 32000, device=dev) * 3)
        pos.fill_(8 + step)
        graph.replay()
        want = call()
        torch.cuda.synchronize()
        assert torch.equal(out.token_ids, want.token_ids)
        assert torch.equal(out.logprobs.token_ids, want.logprobs.token_ids)
        assert torch.equal(out.logprobs.logprobs, want.logprobs.logprobs)


@pytest.mark.gpu
def test_ops_compile_with_inductor_on_the_gpu():
    """torch.compile(fullgraph=True, inductor) of a step calling the ops on CUDA tensors: the
    custom ops stay opaque calls into the sampling kernels, with the eager tokens and logprobs."""
    dev = torch.device("cuda")
    rows = 8

    def step(x, t, k, seeds, pos, hist):
        l = ops.apply_penalties(x * 1.0, output_token_ids=hist, repetition=1.3, frequency=0.2)
        out = ops.sample(l, temperature=t, top_k=k, top_p=0.9, seeds=seeds, positions=pos, logprobs=2)
        return out.token_ids, out.logprobs.logprobs

    compiled = torch.compile(step, fullgraph=True)
    for i in range(2):
        g = torch.Generator(device=dev).manual_seed(i)
        args = (torch.randn(rows, 32000, device=dev, generator=g) * 3,
                torch.linspace(0, 1.2, rows, device=dev), torch.tensor([0, 50] * (rows // 2), device=dev),
                torch.arange(rows, device=dev), torch.full((rows,), 7 + i, dtype=torch.int64, device=dev),
                torch.randint(0, 32000, (rows, 5), device=dev, generator=g))
        for a, b in zip(compiled(*args), step(*args)):
            assert torch.equal(a, b)


@pytest.mark.gpu
def test_ops_direct_route_gives_the_table_route_tokens_on_the_gpu():
    """Without logprobs the op launches the kernels from its tensors directly; with logprobs it
    goes through the Sampler's tables: the same tokens, NaN counts and guard flags."""
    dev = torch.device("cuda")
    rows = 64
    g = torch.Generator(device=dev).manual_seed(3)
    x = torch.randn(rows, 50000, device=dev, generator=g) * 3
    x[5, ::3] = float("nan")
    x[6] = NEG_INF
    def cycle(values):
        return torch.tensor(values * (rows // len(values)), device=dev)
    kw = {"temperature": torch.linspace(0, 1.5, rows, device=dev), "top_k": cycle([0, 20, -1, 60000]),
          "top_p": cycle([1.0, 0.9, 0.5, 0.95]), "min_p": cycle([0.0, 0.0, 0.05, 0.0]),
          "seeds": torch.arange(rows, device=dev) * 7,
          "positions": torch.full((rows,), 11, dtype=torch.int64, device=dev)}
    direct = ops.sample(x, **kw)
    table = ops.sample(x, logprobs=1, **kw)
    assert torch.equal(direct.token_ids, table.token_ids)
    assert torch.equal(direct.num_nans, table.num_nans) and torch.equal(direct.fallback, table.fallback)


@pytest.mark.gpu
def test_ops_launch_list_replays_give_the_eager_results_on_the_gpu(monkeypatch):
    """Repeated calls of one shape replay the first call's launches with integer pointers: over
    new logits and parameter tensors each call, the tokens, guard flags and raw logprobs of the
    same call launched normally (no launch list), at full vocabulary."""
    from tpsample.ops import direct
    dev = torch.device("cuda")
    rows, vocab = 64, 151936
    monkeypatch.setattr(direct, "_SITES", {})

    def inputs(step):
        g = torch.Generator(device=dev).manual_seed(step)
        x = torch.randn(rows, vocab, device=dev, generator=g) * 3
        x[3, ::5] = float("nan")
        kw = {"temperature": torch.linspace(0, 1.5, rows, device=dev),
              "top_k": torch.tensor([0, 50, -1, 0] * (rows // 4), device=dev),
              "top_p": torch.tensor([1.0, 0.9, 0.95, 0.8] * (rows // 4), device=dev),
              "min_p": torch.tensor([0.0, 0.0, 0.05, 0.0] * (rows // 4), device=dev),
              "seeds": torch.arange(rows, device=dev) * 3, "positions": torch.full((rows,), 9 + step, device=dev)}
        return x, kw

    for lp in (None, 4):
        for step in range(4):
            x, kw = inputs(step)
            got = ops.sample(x, logprobs=lp, **kw)
            with monkeypatch.context() as m:
                m.setattr(direct, "RECORD_TRIES", 0)
                m.setattr(direct, "_SITES", {})
                want = ops.sample(x.clone(), logprobs=lp, **{k: v.clone() for k, v in kw.items()})
            assert torch.equal(got.token_ids, want.token_ids) and torch.equal(got.fallback, want.fallback), (lp, step)
            assert torch.equal(got.num_nans, want.num_nans)
            if lp is not None:
                for name in ("token_ids", "logprobs", "ranks"):
                    assert torch.equal(getattr(got.logprobs, name), getattr(want.logprobs, name)), (lp, step, name)
    lists = [v for v in direct._SITES.values() if not isinstance(v, int)]
    assert len(lists) == 2
