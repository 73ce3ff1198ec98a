"""The one-launch penalty kernel (`tpsample.kernels.penalties`) leaves the logits bit for bit as
the torch processors do: repetition over the prompt set and the outputs, then frequency and
presence over the outputs, with repeated tokens, drafts in the outputs, empty prompt sets,
rows with one penalty only, tokens outside a vocab shard, and -inf / +-0 entries.

Runs the kernel under TRITON_INTERPRET=1 on CPU, or compiled when CUDA is present.
"""
import pytest
import torch

pytest.importorskip("triton")

from tpsample.sampling.penalties import PenaltyRows, penalties_torch  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.usefixtures("triton_interpreter")
V = 500


@pytest.fixture(scope="module")
def kernel(triton_interpreter):
    """Imported here, not at the top: triton.jit picks interpreted or compiled at import."""
    from tpsample.kernels.penalties import apply_penalties_
    return apply_penalties_


def _case(seed: int, rows: int = 7, slots: int = 10, width: int = 60, prompt: int = 40):
    g = torch.Generator().manual_seed(seed)
    f32 = torch.zeros(6, slots)
    f32[3] = 1.0 + torch.rand(slots, generator=g)                      # rep
    f32[4] = torch.rand(slots, generator=g) - 0.3                      # freq (some negative)
    f32[5] = torch.rand(slots, generator=g)                            # pres
    f32[3, 0], f32[4, 1], f32[5, 1], f32[4, 2] = 1.0, 0.0, 0.0, 0.0    # rep only / freq+pres only / pres only
    table = torch.full((slots, prompt), -1, dtype=torch.int32)
    for s in range(slots):
        n = int(torch.randint(0, prompt + 1, (1,), generator=g))
        if s == 0:
            n = 0                                                      # no prompt set (no repetition)
        ids = torch.unique(torch.randint(0, V, (n,), generator=g))
        table[s, : len(ids)] = ids.to(torch.int32)
    seq = torch.randint(0, 40, (rows, width), generator=g) * 12         # few distinct ids (many repeats), spread
    lens = torch.randint(0, width + 1, (rows,), generator=g)
    lens[0] = 0                                                        # no outputs yet
    seq[torch.arange(width).unsqueeze(0) >= lens.unsqueeze(1)] = -1
    row_ids = torch.randperm(rows + 3, generator=g)[:rows]
    slot_ids = torch.randperm(slots, generator=g)[:rows]
    x = torch.randn(rows + 3, V, generator=g) * 3
    x[:, :5] = torch.tensor([0.0, -0.0, float("-inf"), 1e-30, -1e-30])
    return x, row_ids, slot_ids, seq, table, f32


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shard", [(0, V), (130, 250)])
def test_penalty_kernel_equals_torch_processors_bitwise(kernel, seed, shard):
    x, rows, slots, seq, table, f32 = _case(seed, prompt=40 if seed < 3 else 450)   # 450: several blocks
    start, end = shard
    width = int((table >= 0).sum(dim=1).max())
    pen = PenaltyRows(rows, slots, seq, table, width, f32, (3, 4, 5))
    want = x[:, start:end].clone()
    _torch_penalties(want, pen, start)
    got = x[:, start:end].clone().to(DEV)
    kernel(got, start, rows.to(DEV), slots.to(DEV), torch.sort(seq, dim=1).values.to(DEV), table.to(DEV), width,
           f32.to(DEV), (3, 4, 5))
    assert not torch.equal(want, x[:, start:end])                      # the penalties did something
    assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32))


def _torch_penalties(l, pen, col_start):
    """The torch op, forced (the kernel would run on a kernel device)."""
    penalties_torch(l, pen, col_start)


def test_penalty_kernel_with_no_prompt_table_and_long_outputs(kernel):
    x, rows, slots, _, _, f32 = _case(9, width=10)
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, V, (rows.shape[0], 700), generator=g)       # more outputs than one block
    pen = PenaltyRows(rows, slots, seq, None, 0, f32, (3, 4, 5))
    want = x.clone()
    _torch_penalties(want, pen, 0)
    got = x.clone().to(DEV)
    kernel(got, 0, rows.to(DEV), slots.to(DEV), torch.sort(seq, dim=1).values.to(DEV), None, 0, f32.to(DEV), (3, 4, 5))
    assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("shard", [(0, V), (130, 250)])
def test_penalty_kernel_reading_the_ascending_history_equals_torch_processors(kernel, shard):
    """Steps without drafts: the kernel reads each slot's outputs from the history kept ascending
    (`History.ordered`, its first num_out entries) instead of a sorted copy of the step's rows."""
    x, rows, slots, seq, table, f32 = _case(5)
    start, end = shard
    width = int((table >= 0).sum(dim=1).max())
    lens = (seq >= 0).sum(dim=1)
    cap = seq.shape[1] + 8
    ordered = torch.full((table.shape[0], cap + 1), -1, dtype=torch.int32)
    num_out = torch.zeros(table.shape[0], dtype=torch.int64)
    for i, s in enumerate(slots.tolist()):
        ordered[s, : int(lens[i])] = torch.sort(seq[i, : int(lens[i])]).values.to(torch.int32)
        num_out[s] = lens[i]
    ordered[:, -1] = 7 * 12                 # scratch column: never read
    pen = PenaltyRows(rows, slots, seq, table, width, f32, (3, 4, 5))
    want = x[:, start:end].clone()
    _torch_penalties(want, pen, start)
    got = x[:, start:end].clone().to(DEV)
    kernel(got, start, rows.to(DEV), slots.to(DEV), ordered.to(DEV), table.to(DEV), width, f32.to(DEV), (3, 4, 5),
           num_out.to(DEV))
    assert not torch.equal(want, x[:, start:end])
    assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32))
