"""The per-step kernels (`tpsample.kernels.step_ops`, `history`) give the torch versions'
results exactly: row keys bit for bit, the history append token for token, with its ascending
copy sorted after every step (for the slots told to keep one).

Runs the kernels under TRITON_INTERPRET=1 on CPU, or compiled when CUDA is present.
"""
import pytest
import torch

pytest.importorskip("triton")

from tpsample import noise  # noqa: E402
from tpsample.state.store import History  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture(scope="module")
def step_ops(triton_interpreter):
    """Imported here, not at the top: triton.jit picks interpreted or compiled at import."""
    from tpsample.kernels import step_ops
    return step_ops


@pytest.mark.parametrize("salt", [noise.SALT_DRAW, noise.SALT_ACCEPT, noise.SALT_RESIDUAL])
def test_row_keys_kernel_equals_torch_bits(step_ops, salt):
    g = torch.Generator().manual_seed(salt)
    seeds = torch.randint(-2**63, 2**63 - 1, (300,), generator=g, dtype=torch.int64)
    seeds[:3] = torch.tensor([0, -1, noise.seed_to_int64(2**64 - 1)])
    positions = torch.randint(0, 2**40, (300,), generator=g, dtype=torch.int64)
    positions[:2] = torch.tensor([0, 2**33 + 5])
    want = noise.row_keys(seeds, positions, salt)
    got = step_ops.row_keys(seeds.to(DEV), positions.to(DEV), salt)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


def _histories(slots: int, need: int) -> tuple[History, History]:
    """Two empty histories of `slots` slots on DEV with room for `need` tokens each."""
    pair = History(), History()
    for h in pair:
        for slot in range(slots):
            h.reset(slot)
        h.sync(DEV, slots, need)
    return pair


def test_append_kernel_equals_torch_append_and_keeps_the_ascending_copy(step_ops):
    from tpsample.kernels.step_ops import append_history
    g = torch.Generator().manual_seed(0)
    a, b = _histories(6, 900)
    for step in range(260):
        slots = torch.randperm(6, generator=g)[: 4 + 2 * (step % 2)].to(DEV)
        n, width = len(slots), 1 + step % 3
        tokens = torch.randint(0, 40, (n, width), generator=g).to(DEV)        # repeats: equal tokens
        counts = torch.randint(1, width + 1, (n,), generator=g).to(DEV)
        if step >= 252:
            tokens.zero_()                                           # inserted first: whole rows move
        tokens[torch.arange(width, device=DEV).unsqueeze(0) >= counts.unsqueeze(1)] = -1
        block = torch.cat([tokens, counts.unsqueeze(1)], dim=1)      # strided views, as the sampler passes
        a.append(slots, block[:, :width], block[:, width])
        # the first steps fill both through torch (fast under the interpreter); the kernel then
        # inserts into rows longer than one of its shift blocks
        b.append(slots, block[:, :width], block[:, width], kernel=append_history if step >= 240 else None)
    assert torch.equal(a.num_out, b.num_out)
    assert torch.equal(a.tokens[:, :-1], b.tokens[:, :-1])        # the scratch column may differ
    assert torch.equal(a.ordered[:, :-1], b.ordered[:, :-1])
    assert int(a.num_out[:6].max()) > 256                          # a row longer than one shift block
    for slot in range(6):
        n = int(a.num_out[slot])
        want = torch.sort(a.tokens[slot, :n]).values
        assert torch.equal(b.ordered[slot, :n].cpu(), want.cpu()) and int(b.ordered[slot, n]) == -1


def test_only_slots_whose_flags_meet_the_mask_keep_the_ascending_copy(step_ops):
    """The store keeps the ascending copy for requests with penalties only: the kernel and the
    torch append agree, the flagged slots' copies stay sorted, the others' stay -1."""
    from tpsample.kernels.step_ops import append_history
    g = torch.Generator().manual_seed(1)
    flags = torch.tensor([16, 0, 32, 0, 48, 8], dtype=torch.int64, device=DEV)      # 16 | 32: penalties
    a, b = _histories(6, 64)
    for step in range(12):
        slots = torch.randperm(6, generator=g)[:5].to(DEV)
        tokens = torch.randint(0, 30, (5, 2), generator=g).to(DEV)
        counts = torch.randint(1, 3, (5,), generator=g).to(DEV)
        tokens[torch.arange(2, device=DEV).unsqueeze(0) >= counts.unsqueeze(1)] = -1
        block = torch.cat([tokens, counts.unsqueeze(1)], dim=1)
        a.append(slots, block[:, :2], block[:, 2], ordered_flags=(flags, 16 | 32))
        b.append(slots, block[:, :2], block[:, 2], kernel=append_history if step >= 8 else None,
                 ordered_flags=(flags, 16 | 32))
    assert torch.equal(a.num_out, b.num_out) and torch.equal(a.tokens[:, :-1], b.tokens[:, :-1])
    assert torch.equal(a.ordered[:, :-1], b.ordered[:, :-1])
    for slot in range(6):
        n = int(a.num_out[slot])
        assert n > 0
        if flags[slot] & (16 | 32):
            assert torch.equal(b.ordered[slot, :n].cpu(), torch.sort(b.tokens[slot, :n]).values.cpu())
        else:
            assert bool((b.ordered[slot] == -1).all())


def test_append_kernel_drops_tokens_past_the_capacity_from_both_tables(step_ops):
    from tpsample.kernels.step_ops import append_history
    h = History()
    h.reset(0)
    h.sync(DEV, 1, 64)
    cap = h.capacity
    for _ in range(cap + 3):
        h.append(torch.zeros(1, dtype=torch.int64, device=DEV), torch.tensor([[cap]], device=DEV),
                 torch.ones(1, dtype=torch.int64, device=DEV), kernel=append_history)
    assert int(h.num_out[0]) == cap + 3
    assert torch.equal(h.ordered[0, :cap].cpu(), torch.full((cap,), cap, dtype=torch.int32))
    assert torch.equal(h.tokens[0, :cap].cpu(), torch.full((cap,), cap, dtype=torch.int32))


def test_mask_nans_kernel_equals_torch_and_counts_per_row(step_ops):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 3000, generator=g)
    x[torch.rand(x.shape, generator=g) < 0.05] = float("nan")
    x[2] = float("nan")
    x[3, :10] = float("inf")
    ref = x.clone()
    ref_counts = torch.isnan(ref).sum(dim=1)
    ref[torch.isnan(ref)] = float("-inf")
    got = x.to(DEV).clone()
    counts = step_ops.mask_nans_(got)
    assert torch.equal(got.cpu(), ref) and torch.equal(counts.cpu(), ref_counts)
    assert int(ref_counts[2]) == 3000


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("shard", [(0, 20000), (5000, 19000)])
def test_row_prep_kernel_equals_nan_mask_bitmask_and_argmax(step_ops, masked, shard):
    """One pass gives what processors.mask_nans, processors.apply_bitmask and draw.local_argmax
    give in that order: the same row bits, NaN counts, and best allowed token (lowest id on ties)."""
    from tpsample.kernels.step_ops import prep_rows_
    from tpsample.sampling import processors as P
    from tpsample.sampling.draw import local_argmax
    start, end = shard
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, end - start, generator=g)
    x[torch.rand(x.shape, generator=g) < 0.05] = float("nan")
    x[1] = float("nan")                                    # nothing finite: token 0
    x[2, 100], x[2, 1500], x[2, -10] = 50.0, 50.0, 50.0    # ties: two blocks of one part, and another part
    x[3, 5:9] = float("inf")
    x[4] = float("-inf")
    words = (20000 + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (6, words), generator=g, dtype=torch.int64).to(torch.int32)
    bitmask[2] = -1                                        # all allowed (the tie stays)
    ref = x.clone()
    ref_nans = P.mask_nans(ref, [(0, 6)])
    if masked:
        P.apply_bitmask(ref, bitmask, start)
    ref_v, ref_i = local_argmax(ref, start)
    ref_i = torch.where(ref_v > float("-inf"), ref_i, 0)
    got = x.to(DEV).clone()
    nans, gv, gi = prep_rows_(got, start, bitmask.to(DEV) if masked else None)
    best = gv.max(dim=1).values
    ids = torch.where(gv == best.unsqueeze(1), gi, torch.iinfo(torch.int64).max).min(dim=1).values
    ids = torch.where(best > float("-inf"), ids, 0)
    assert torch.equal(got.cpu().view(torch.int32), ref.view(torch.int32))
    assert torch.equal(nans.sum(dim=1).cpu().to(torch.int64), ref_nans)
    assert torch.equal(ids.cpu(), ref_i) and torch.equal(best.cpu(), ref_v)
    assert int(ref_i[1]) == 0 and int(ref_i[2]) == start + 100 and int(ref_nans[1]) == end - start


def test_a_sampler_keeps_the_ascending_history_only_for_requests_with_penalties():
    """Its only reader is the penalty step: a request without penalties never pays for it."""
    import tpsample
    s = tpsample.Sampler(64, max_num_reqs=4, seed=0)
    params = {"plain": {}, "rep": {"repetition_penalty": 1.3}, "freq": {"frequency_penalty": 0.5},
              "pres": {"presence_penalty": 0.5}}
    slots = {rid: s.add_request(rid, tpsample.SamplingParams(seed=1, **p), [1, 2, 3]) for rid, p in params.items()}
    ids = list(params)
    for _ in range(6):
        s.sample(torch.randn(len(ids), 64), s.plan(ids)).token_lists()
    h = s.store.history
    for rid, slot in slots.items():
        n = int(h.num_out[slot])
        assert n == 6
        if rid == "plain":
            assert bool((h.ordered[slot] == -1).all())
        else:
            assert torch.equal(h.ordered[slot, :n], torch.sort(h.tokens[slot, :n]).values)
