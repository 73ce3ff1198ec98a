"""`tpsample.ops` on the fused-kernel path (CPU under Triton's interpreter, as CI runs the
kernels): the Sampler's kernel-path tokens and raw logprobs bit for bit, and the kernels fed
stand-in host parameters (what a device-tensor call without host values does) agree."""
from __future__ import annotations

import pytest
import torch
from test_ops import PARAMS, PROMPT_LENS, V, per_row, sampler_run, special_rows

from tpsample import SamplingParams as SP
from tpsample import ops

pytest.importorskip("triton")
pytestmark = [pytest.mark.usefixtures("triton_interpreter"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]   # numpy's inf - inf in masked lanes


@pytest.fixture
def kernel_calls(monkeypatch):
    """The kernels run on CPU; counts calls of the sampling kernel's entry point (no launch list
    recorded before the test)."""
    import tpsample.kernels.sample as dispatch
    from tpsample.ops import direct
    monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", "1")
    monkeypatch.setattr(direct, "_SITES", {})
    calls = [0]
    real = dispatch.sample_rows

    def counted(*a, **k):
        calls[0] += 1
        return real(*a, **k)
    monkeypatch.setattr(dispatch, "sample_rows", counted)     # the fast path looks it up per call
    return calls


def test_kernel_path_gives_the_sampler_kernel_tokens_and_logprobs(kernel_calls):
    params = [SP(**{**p.__dict__, "logprobs": 2}) for p in PARAMS]
    want = sampler_run(params, PROMPT_LENS, 2, special_rows)
    before = kernel_calls[0]
    for step, w in enumerate(want):
        got = ops.sample(special_rows(step), logprobs=2, **per_row(PARAMS, PROMPT_LENS, step))
        assert got.token_ids.tolist() == w.sampled_token_ids[:, 0].tolist(), step
        assert got.fallback.tolist() == [bool(f) for f in w.num_fallback.tolist()]
        for name in ("token_ids", "logprobs", "ranks"):
            assert torch.equal(getattr(got.logprobs, name), getattr(w.logprobs, name)), name
        lp = ops.logprobs(special_rows(step), got.token_ids, 2)       # the statistics kernel's branch
        for name in ("token_ids", "logprobs", "ranks"):
            assert torch.equal(getattr(lp, name), getattr(w.logprobs, name)), name
    assert kernel_calls[0] == before + 1      # the first step launched the kernels, the second its launch list


def test_kernels_with_stand_in_host_values_give_the_same_tokens(kernel_calls):
    """Device tensors give the op no host values: the table then holds stand-ins and every kernel
    hint is on. Here (CPU) the same table is built both ways and sampled by the kernels."""
    from tpsample.ops.args import normalise
    from tpsample.ops.impl import host_params
    from tpsample.ops.table import RowTable, sample_full
    rows = per_row(PARAMS, PROMPT_LENS, 3)
    t = rows["temperature"].float()
    k, p, m = normalise(t, rows["top_k"], rows["top_p"].float(), rows["min_p"].float(), V)
    x = special_rows(1)
    got = []
    for host in (host_params(t, k, p, m), None):
        table = RowTable.build(t, k, p, m, rows["seeds"], rows["positions"], num_logprobs=-1, processed=False,
                               vocab_size=V, host=host, hints=-1)
        got.append(sample_full(x, table, None, 0)[0].tolist())
    assert got[0] == got[1]
    assert got[0] == ops.sample(x, **rows).token_ids.tolist()


def test_penalty_kernel_gives_the_torch_processors_values(monkeypatch):
    """ops.apply_penalties through the one-launch kernel equals the torch processors bitwise,
    prompts with repeated tokens included (the kernel reads each prompt token once)."""
    from test_ops import PEN, PEN_PROMPTS, padded, repeating
    x = repeating(0)
    history = [[10, 10, 11], [], [12, 5, 12, 12], [14], [10, 10], [3]]
    args = dict(output_token_ids=padded(history), prompt_token_ids=padded(PEN_PROMPTS, width=6),
                repetition=torch.tensor([p.repetition_penalty for p in PEN]),
                frequency=torch.tensor([p.frequency_penalty for p in PEN]),
                presence=torch.tensor([p.presence_penalty for p in PEN]))
    got = {}
    for on in ("0", "1"):
        monkeypatch.setenv("TPSAMPLE_KERNELS_ON_CPU", on)
        got[on] = ops.apply_penalties(x, **args)
    assert torch.equal(got["0"], got["1"])
    assert not torch.equal(got["0"], x)


def test_the_direct_kernel_route_gives_the_sampler_tokens(kernel_calls, monkeypatch):
    """Without logprobs or a bitmask the op launches the kernels straight from its per-row
    tensors (no tables): the Sampler's tokens, NaN counts and guard flags, with the hints the
    host knows and with every hint on (what device tensors give)."""
    import tpsample.ops.impl as impl
    direct = [0]
    real = impl.sample_direct

    def counted(*a, **k):
        direct[0] += 1
        return real(*a, **k)
    monkeypatch.setattr(impl, "sample_direct", counted)
    want = sampler_run(PARAMS, PROMPT_LENS, 3, special_rows)
    for step, w in enumerate(want):
        rows = per_row(PARAMS, PROMPT_LENS, step)
        got = ops.sample(special_rows(step), **rows)
        assert got.logprobs is None
        assert got.token_ids.tolist() == w.sampled_token_ids[:, 0].tolist(), step
        assert got.fallback.tolist() == [bool(f) for f in w.num_fallback.tolist()]
        assert got.num_nans.tolist() == w.num_nans.tolist()
        raw = torch.ops.tpsample.sample(special_rows(step), rows["temperature"].float(), rows["top_k"],
                                        rows["top_p"].float(), rows["min_p"].float(), rows["seeds"],
                                        rows["positions"], None, -1, False, -1)
        assert raw[0].tolist() == got.token_ids.tolist() and raw[1].tolist() == got.fallback.tolist()
    assert direct[0] == 2 * len(want)
