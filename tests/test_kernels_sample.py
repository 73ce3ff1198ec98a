"""`kernels.sample.sample_rows` gives exactly the tokens of the torch reference.

Small shapes under TRITON_INTERPRET=1 on CPU (compiled kernels when CUDA is present). Each batch
mixes row configurations; KernelConfig variants force the candidate path, the exact search
(tiny CAP), several programs per row and several blocks per program.
"""
import zlib

import pytest
import torch

pytest.importorskip("triton")

import kernels_torch_ref as torch_ref

from tpsample import noise as rng
from tpsample.kernels.sample import KernelConfig, sample_rows

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.usefixtures("triton_interpreter"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]   # numpy's inf - inf in masked lanes
NEG_INF = float("-inf")
# (temperature, top_k, top_p, min_p)
GREEDY = (0.0, 0, 1.0, 0.0)
TEMPERATURE = (0.8, 0, 1.0, 0.0)
CONFIGS = [GREEDY, TEMPERATURE, (1.0, 0, 1.0, 0.0), (0.8, 5, 1.0, 0.0), (0.8, 50, 0.9, 0.0), (0.8, 0, 0.9, 0.0),
           (0.8, 0, 1.0, 0.05), (1.3, 0, 0.3, 0.0), (0.7, 150, 1.0, 0.0), (1.0, 3, 0.5, 0.2), (2.0, 0, 0.99, 0.0),
           (0.5, 1, 1.0, 0.0), (1.0, 299, 1.0, 0.0), (1.0, 400, 0.95, 0.0), (0.9, 200, 0.9, 0.01), (1.0, 0, 0.0001, 0.0),
           (0.9, 0, 0.9, 0.02)]
TOP_P_ALONE = [(0.8, 0, 0.9, 0.0), (1.3, 0, 0.3, 0.0), (2.0, 0, 0.99, 0.0), (1.0, 0, 0.0001, 0.0), (0.9, 0, 0.9, 0.02),
               (1.0, 0, 0.999, 0.0)]
DEFAULT = KernelConfig()
SEARCH = KernelConfig(cap=8, small=4, splits=2, block=64, scan_cols=64)          # exact search path
SPLIT = KernelConfig(cap=16, small=8, splits=4, block=32, scan_cols=32, pivots=4, bins=16)


def params(rows):
    t = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    k = torch.tensor([r[1] for r in rows], dtype=torch.int32)
    p = torch.tensor([r[2] for r in rows], dtype=torch.float32)
    lmp = torch.log(torch.tensor([r[3] for r in rows], dtype=torch.float32))
    return t, k, p, lmp


def row_keys(n, seed):
    return rng.row_keys(torch.arange(n, dtype=torch.int64) * 7919 + seed, torch.arange(n, dtype=torch.int64) + 11,
                        rng.SALT_DRAW)


def logits(kind: str, rows: int, cols: int, gen) -> torch.Tensor:
    if kind == "randn":
        return torch.randn(rows, cols, generator=gen) * 3
    if kind == "zipf":      # a peaked row: log of a Zipf law over a random permutation
        ranks = torch.stack([torch.randperm(cols, generator=gen) for _ in range(rows)]) + 1
        return -1.1 * torch.log(ranks.float()) + 0.01 * torch.randn(rows, cols, generator=gen)
    if kind == "ties":
        return (torch.randn(rows, cols, generator=gen) * 2).round() / 2
    raise ValueError(kind)


def check(x, rows, cfg=DEFAULT, seed=0, col_offset=0):
    t, k, p, lmp = params(rows)
    k0, k1 = row_keys(len(rows), seed)
    got = sample_rows(x.to(DEV), t.to(DEV), k.to(DEV), p.to(DEV), lmp.to(DEV), k0.to(DEV), k1.to(DEV),
                      col_offset=col_offset, cfg=cfg)
    want = torch_ref.sample_rows(x, t, k, p, lmp, k0, k1, col_offset=col_offset)
    assert got[0].cpu().tolist() == want[0].tolist(), (rows, got, want)
    assert got[1].cpu().tolist() == want[1].tolist(), (rows, got, want)
    return want


@pytest.mark.parametrize("kind,cfg", [("randn", DEFAULT), ("randn", SEARCH), ("randn", SPLIT), ("zipf", DEFAULT),
                                      ("zipf", SEARCH), ("ties", DEFAULT), ("ties", SEARCH)])
def test_mixed_batches_match_reference_token_for_token(kind, cfg):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{kind}/{cfg.cap}".encode()) % 1000)   # not hash(): salted
    for seed in range(2):
        rows = [CONFIGS[int(i)] for i in torch.randint(0, len(CONFIGS), (6,), generator=gen)]
        check(logits(kind, 6, 300, gen), rows, cfg, seed)


@pytest.mark.parametrize("config", CONFIGS[:8], ids=lambda c: "T{}_k{}_p{}_minp{}".format(*c))
def test_each_configuration_alone(config):
    gen = torch.Generator().manual_seed(1)
    check(logits("randn", 4, 257, gen), [config] * 4, SEARCH if config[1] or config[2] < 1 else DEFAULT)


@pytest.mark.parametrize("plain_cols", [32, 512])
def test_batches_without_filters_give_the_same_tokens_at_their_own_scan_shape(plain_cols):
    """A batch of greedy and temperature-only rows is scanned in its own (shorter) steps and
    warps (`draw_scan_cols`, `draw_scan_warps`), a greedy-only batch in its own
    (`plain_scan_cols`); the draw is exact at any step, including across several steps and
    programs per row."""
    gen = torch.Generator().manual_seed(4)
    rows = [GREEDY, TEMPERATURE, (1.0, 0, 1.0, 0.0), (2.5, 0, 1.0, 0.0)] * 2
    x = logits("randn", len(rows), 1500, gen)
    for cfg in (KernelConfig(draw_scan_cols=plain_cols), KernelConfig(draw_scan_cols=plain_cols, splits=4)):
        check(x, rows, cfg)
    for cfg in (KernelConfig(plain_scan_cols=plain_cols), KernelConfig(plain_scan_cols=plain_cols, splits=4)):
        check(x[:2], [GREEDY] * 2, cfg)


def test_temperature_only_batches_take_one_warp_short_steps_on_cuda_and_the_plain_steps_elsewhere():
    """The draw shape (`draw_scan_cols` None): 128-column steps on one warp on CUDA; under the
    interpreter, whose cost is per step, the plain batches' steps; a set value holds anywhere."""
    from tpsample.kernels.sample.launch import draw_config, plain_config
    on_cuda, elsewhere = draw_config(DEFAULT, True), draw_config(DEFAULT, False)
    assert (on_cuda.scan_cols, on_cuda.scan_warps) == (128, 1)
    assert elsewhere.scan_cols == plain_config(DEFAULT).scan_cols == 512
    assert draw_config(KernelConfig(draw_scan_cols=64), False).scan_cols == 64


def test_the_list_kernel_takes_8_warps_of_128_registers_on_cuda_and_4_warps_elsewhere():
    """`list_warps` None: 8 warps on CUDA at any row count, capped at `list_regs` registers a
    thread (two programs a SM), 4 off CUDA; a set value holds anywhere."""
    from tpsample.kernels.sample import launch as sample_launch
    cuda = torch.device("cuda", 0)
    assert sample_launch.list_warps(cuda, DEFAULT) == 8
    assert DEFAULT.list_regs == 128
    assert sample_launch.list_warps(torch.device("cpu"), DEFAULT) == 4
    assert sample_launch.list_warps(cuda, KernelConfig(list_warps=2)) == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_are_upcast_per_block(dtype):
    gen = torch.Generator().manual_seed(2)
    x = logits("randn", 6, 300, gen).to(dtype)
    rows = [GREEDY, TEMPERATURE, (0.8, 50, 0.9, 0.0), (0.8, 0, 0.9, 0.0), (0.8, 0, 1.0, 0.05), (1.0, 20, 1.0, 0.0)]
    check(x, rows)
    check(x, rows, SEARCH)


def test_nan_and_infinite_rows_are_guarded():
    gen = torch.Generator().manual_seed(3)
    x = logits("randn", 6, 200, gen)
    x[0, ::3] = float("nan")                  # NaN counts as -inf
    x[1] = NEG_INF                            # nothing finite: token 0, flagged
    x[2] = float("nan")
    x[3, :150] = NEG_INF                      # few finite entries, fewer than top_k
    x[4, 17] = float("inf")                   # +inf wins when kept
    x[5, 5:] = NEG_INF
    for config in [GREEDY, TEMPERATURE, (0.8, 60, 0.9, 0.0), (0.8, 0, 0.9, 0.1), (1.0, 3, 1.0, 0.0)]:
        check(x, [config] * 6)
        check(x, [config] * 6, SEARCH)


@pytest.mark.parametrize("config", [GREEDY, TEMPERATURE, (0.8, 0, 0.9, 0.0)], ids=["greedy", "plain", "top_p"])
def test_nan_counts_are_exact_whatever_the_infinities(config):
    """The scan flags NaN by a running sum a lane (+inf meeting -inf flags it too) and counts
    only flagged splits in a second read: every row's count equals torch's, with NaN anywhere,
    with both infinities and no NaN, and with overflowing sums."""
    gen = torch.Generator().manual_seed(8)
    x = logits("randn", 6, 700, gen)
    x[0, ::7] = float("nan")
    x[1, 3], x[1, 650] = float("inf"), NEG_INF            # flagged, but no NaN: count 0
    x[2, ::5] = 3e38                                      # sums overflow to +inf, then -inf below
    x[2, 1::50] = NEG_INF
    x[3, 699] = float("nan")                              # the last column, in a partial step
    x[4, 0] = float("nan")
    x[4, 1] = float("inf")
    x[5] = float("nan")
    t, k, p, lmp = params([config] * 6)
    k0, k1 = row_keys(6, 0)
    for cfg in (DEFAULT, KernelConfig(splits=4, scan_cols=64, draw_scan_cols=64)):
        nans = torch.zeros(6, dtype=torch.int64, device=DEV)
        sample_rows(x.to(DEV), t.to(DEV), k.to(DEV), p.to(DEV), lmp.to(DEV), k0.to(DEV), k1.to(DEV), cfg=cfg,
                    nans_out=nans)
        assert nans.cpu().tolist() == torch.isnan(x).sum(dim=1).tolist()
        check(x, [config] * 6, cfg)


def test_ties_go_to_the_lowest_id():
    x = torch.zeros(3, 64)
    x[:, 10] = x[:, 40] = 5.0
    check(x, [GREEDY, (1.0, 2, 1.0, 0.0), (1.0, 0, 0.5, 0.0)])
    x = torch.full((2, 64), 1.0)
    check(x, [(1.0, 7, 1.0, 0.0), (1.0, 0, 0.3, 0.0)], SEARCH)


def test_strided_rows_and_column_offset():
    gen = torch.Generator().manual_seed(4)
    big = logits("randn", 5, 400, gen)
    x = big[:, 50:330]                        # row stride 400, unaligned start
    rows = [TEMPERATURE, (0.8, 50, 0.9, 0.0), GREEDY, (0.8, 0, 1.0, 0.05), (0.8, 0, 0.9, 0.0)]
    assert _paths(x, rows, DEFAULT, col_offset=1000) == (1, 0, 0)      # the top-p row, from the list
    for cfg in (KernelConfig(**NO_LIST), KernelConfig(bracket_all=0, **NO_LIST)):   # lean (and drawn above its bracket)
        assert _paths(x, rows, cfg, col_offset=1000) == (0, 1, 0)
    check(x, rows, SPLIT, col_offset=77)


def test_single_row_with_many_programs():
    gen = torch.Generator().manual_seed(5)
    x = logits("zipf", 1, 1000, gen)
    for config in [TEMPERATURE, (0.8, 50, 0.9, 0.0), (0.8, 0, 0.95, 0.0)]:
        check(x, [config], KernelConfig(splits=8, block=32, scan_cols=32, cap=16, small=8))


@pytest.mark.parametrize("cfg", [DEFAULT, KernelConfig(block=1024, num_warps=2, splits=2)],
                         ids=["default", "wide_blocks"])
def test_skip_bounds_hold_at_extreme_magnitudes(cfg):
    """The scan's skip bounds from x * (1 / T) stay upper bounds of x / T + g at every scale:
    rows of size 1e6 and 1e30, T down to 1e-6 (x / T near the fp32 maximum or overflowing),
    rows whose entries are one ulp apart."""
    gen = torch.Generator().manual_seed(12)
    base = torch.randn(8, 300, generator=gen)
    x = torch.stack([base[0] * 1e6, base[1] * 1e30, base[2] * 3e32, base[3] * 1e-30,
                     1.0 + torch.arange(300) * 1.1920929e-07, base[5] * 3, -1e36 + base[6] * 1e30, base[7]])
    for t in (1e-6, 0.37, 1.0, 1e6):
        for filt in ((0, 1.0, 0.0), (0, 0.9, 0.0), (40, 0.9, 0.0), (0, 1.0, 0.1)):
            check(x, [(t, *filt)] * 8, cfg)


def _paths(x, rows, cfg, col_offset=0):
    """(rows the list kernel settled, rows the lean pass settled, rows that fell back to the
    exact search) of one checked call."""
    from tpsample.kernels.launcher import fallback_counter, lean_counter, listed_counter
    counters = [f(torch.device(DEV)) for f in (listed_counter, lean_counter, fallback_counter)]
    before = [int(c.item()) for c in counters]
    check(x, rows, cfg, col_offset=col_offset)
    return tuple(int(c.item()) - b for c, b in zip(counters, before))


TOP_P_WIDE = [r for r in TOP_P_ALONE if r[2] > 0.01]     # rows that keep more than their top entry
# rows whose kept set the guessed list holds on these logits (randn * 3, Zipf, ties; 1,500 columns)
TOP_P_LISTED = [(0.8, 0, 0.9, 0.0), (1.3, 0, 0.3, 0.0), (1.0, 0, 0.0001, 0.0), (0.7, 0, 0.9, 0.05), (0.9, 0, 0.5, 0.1)]
TOP_P_FLAT = [(2.0, 0, 0.99, 0.0), (1.0, 0, 0.999, 0.0)]     # ... and rows that keep most of the row
NO_LIST = {"list_room": 1}      # the guessed list holds about one entry: it settles no such row
KINDS = ["randn", "zipf", "ties"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cfg", [DEFAULT, KernelConfig(splits=4, block=64, scan_cols=64),
                                 KernelConfig(hist_block=128, hist_warps=2, list_warps=2)],
                         ids=["default", "many_programs", "other_shapes"])
def test_top_p_without_top_k_is_settled_exactly_from_one_list(kind, cfg):
    """Top-p rows without top-k (min-p allowed) are resolved from the hist pass's list by the
    list kernel: exact tokens, every row settled there, none left to the bracket or the search.
    Flat rows that keep more entries than the list holds take the bracket method, exactly."""
    gen = torch.Generator().manual_seed(zlib.crc32(kind.encode()) % 1000 + 2)
    x = logits(kind, len(TOP_P_LISTED), 1500, gen)
    assert _paths(x, TOP_P_LISTED, cfg) == (len(TOP_P_LISTED), 0, 0)
    assert _paths(x[:len(TOP_P_FLAT)], TOP_P_FLAT, cfg) == (0, len(TOP_P_FLAT), 0)


def test_top_p_rows_of_tied_logits_settle_from_the_list_with_ties_to_the_lowest_column():
    """Rows whose kept entries all tie (1,000 equal logits, or 700 over 300 lower ones) are
    settled by the list kernel like peaked rows: the whole tie is kept, and the Gumbel argmax
    over it gives the reference's token for several seeds."""
    gen = torch.Generator().manual_seed(9)
    x = logits("zipf", 6, 1000, gen)
    x[3:] = 0.5                                            # flat: every kept entry ties
    x[5, 700:] = 0.25
    rows = [(0.8, 0, 0.9, 0.0), (1.0, 0, 0.8, 0.0), (0.7, 0, 0.5, 0.05), (1.0, 0, 0.99, 0.0), (0.5, 0, 0.3, 0.0),
            (1.0, 0, 0.7, 0.0)]
    for seed in range(3):
        assert _paths(x, rows, DEFAULT) == (6, 0, 0)
        check(x, rows, DEFAULT, seed=seed)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cfg", [KernelConfig(**NO_LIST), KernelConfig(bracket_all=0, **NO_LIST),
                                 KernelConfig(splits=4, block=64, scan_cols=64, lean_block=32, bracket_all=0,
                                              **NO_LIST)],
                         ids=["default", "above_split", "many_programs"])
def test_rows_the_list_does_not_settle_take_the_lean_pass_exactly(kind, cfg):
    """A list that holds less than p of the row's mass settles nothing: the row takes the bins
    pass, whose last program a row makes its bracket, and then the lean pass (the entries above
    the bracket massed and drawn from the lean list, v* certified from the bracket's candidates):
    exact tokens, every row resolved there, none falls back."""
    gen = torch.Generator().manual_seed(zlib.crc32(kind.encode()) % 1000 + 2)
    x = logits(kind, len(TOP_P_WIDE), 1500, gen)
    assert _paths(x, TOP_P_WIDE, cfg) == (0, len(TOP_P_WIDE), 0)


@pytest.mark.parametrize("kind", KINDS)
def test_rows_the_list_does_not_settle_take_the_bracket_collect_exactly_without_the_lean_pass(kind):
    """With the lean pass off, such rows collect their bracket's candidates (and, with nothing
    collected beyond the bracket, the entries above it are massed and drawn by the collect pass
    itself): exact tokens, and no row falls back."""
    gen = torch.Generator().manual_seed(zlib.crc32(kind.encode()) % 1000 + 1)
    x = logits(kind, len(TOP_P_WIDE), 1500, gen)
    for extra in ({}, {"bracket_all": 0}, {"bracket_all": 0, "splits": 4, "block": 64, "scan_cols": 64}):
        assert _paths(x, TOP_P_WIDE, KernelConfig(force={"bracket"}, **NO_LIST, **extra)) == (0, 0, 0)


def test_a_top_p_row_beside_every_other_kind_of_row_keeps_its_exact_token():
    """Greedy, temperature, top-k, top-k + top-p, min-p and top-p rows in one batch, with NaN and
    -inf entries in the top-p rows: every token exact, the top-p rows settled by the list, and
    by the lean pass when the list settles nothing."""
    gen = torch.Generator().manual_seed(21)
    x = logits("randn", len(CONFIGS), 1200, gen)
    x[5, ::97] = float("nan")
    x[16, ::13] = NEG_INF
    alone = sum(1 for r in CONFIGS if r[1] == 0 and r[2] < 1.0)
    wide = sum(1 for r in CONFIGS if r[1] == 0 and 0.01 < r[2] < 1.0)
    flat = sum(1 for r in CONFIGS if r in TOP_P_FLAT)
    assert _paths(x, CONFIGS, DEFAULT) == (alone - flat, flat, 0)
    listed, lean, fallback = _paths(x, CONFIGS, KernelConfig(**NO_LIST))
    assert lean == wide and fallback == 0 and listed == alone - wide


def test_a_list_that_overflows_settles_nothing_and_the_row_keeps_its_exact_token():
    """A list with less room than the entries above its guessed bound (a small CAP: the list
    holds 2 * CAP) overflowed and is not read: rows the default list settles take the bracket
    method instead, exactly."""
    gen = torch.Generator().manual_seed(9)
    rows = [(0.8, 0, 0.9, 0.0), (1.0, 0, 0.9, 0.0), (0.7, 0, 0.8, 0.0)]
    x = logits("randn", len(rows), 1500, gen)
    assert _paths(x, rows, DEFAULT)[0] == len(rows)
    assert _paths(x, rows, KernelConfig(cap=16, small=8))[0] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_lists_spread_over_several_counters_keep_the_tokens_and_the_paths(kind):
    """`list_groups` spreads a row's list appends over several counters (slot i * G + g of group
    g, holes between groups): exact tokens, and the same listed, lean and fallback counts as one
    counter, both for the hist pass's list and the lean pass's (several programs a row too).
    8 groups against one; every other test runs the default's 4."""
    gen = torch.Generator().manual_seed(zlib.crc32(kind.encode()) % 1000 + 5)
    x = logits(kind, len(TOP_P_LISTED), 1500, gen)
    for extra, path in (({}, 0), (NO_LIST, 1), (dict(NO_LIST, splits=4, block=64, scan_cols=64, lean_block=32), 1)):
        one = _paths(x, TOP_P_LISTED, KernelConfig(list_groups=1, **extra))
        assert _paths(x, TOP_P_LISTED, KernelConfig(list_groups=8, **extra)) == one
        assert one[path] >= 3 and one[2] == 0        # the list (or the lean pass) settles most rows


def test_a_lean_list_read_back_in_many_short_chunks_keeps_the_tokens_and_the_paths():
    """The finish reads a lean row's list in chunks of `lean_read_cols` slots, each chunk's
    reads issued before the chunk before it is worked on: exact tokens and the same paths in one
    chunk, in many (32 slots), and in chunks shorter than the list's groups (2 slots, 4 groups:
    each chunk reads its groups' counts)."""
    gen = torch.Generator().manual_seed(zlib.crc32(b"randn") % 1000 + 6)
    rows = TOP_P_WIDE[:4]
    x = logits("randn", len(rows), 600, gen)
    for fc in (1024, 32, 2):
        assert _paths(x, rows, KernelConfig(lean_read_cols=fc, **NO_LIST)) == (0, len(rows), 0)


def _list_group(cols: torch.Tensor, groups: int) -> torch.Tensor:
    return (cols ^ (cols >> 2) ^ (cols >> 3) ^ (cols >> 5)) & (groups - 1)


def test_a_list_crowded_into_one_counter_is_not_trusted_and_falls_back_exactly():
    """When every listed column belongs to one of 8 counters, that group overflows its share of
    the list though the whole list would fit: neither the hist pass's list nor the lean pass's
    is read truncated; the rows take the exact search (counted), with the exact token. One
    counter settles them from the hist pass's list."""
    gen = torch.Generator().manual_seed(31)
    rows = [(0.8, 0, 0.9, 0.0)] * 3
    x = torch.randn(len(rows), 1500, generator=gen)
    cols = torch.arange(1500)
    hot = cols[_list_group(cols, 8) == 0][:30]
    x[:, hot] = 12.0 + 0.01 * torch.randn(len(rows), len(hot), generator=gen)      # ~27 of them kept
    # one program a row (steps start at multiples of the step, where a column's counter is
    # _list_group of the column: claims one entry at a time, also on CUDA, whose packed claims
    # pick the counter by lane); the guessed list aims at the hot columns
    small = {"cap": 64, "small": 32, "splits": 1, "list_room": 32}
    assert _paths(x, rows, KernelConfig(**small)) == (len(rows), 0, 0)
    assert _paths(x, rows, KernelConfig(list_groups=8, force={"unpacked"}, **small)) == (0, 0, len(rows))


def test_flat_rows_keeping_many_entries_settle_from_a_narrowed_bracket_without_the_search():
    """Zipf-like rows at T ~1 and top-p 0.95-0.99 keep 8,000-14,000 of 20,000 entries: more than
    the list holds, and (with 128 bins) a bracket of more than CAP entries. The list kernel
    passes on the exact mass of the bins above its reach, which leaves the bracket's bounds
    wide only over the bins below it, and the bracket is narrowed to CAP entries around the bin
    where v* is estimated: every row is settled there, none takes the exact search, and the
    tokens are the reference's."""
    gen = torch.Generator().manual_seed(21)
    ranks = torch.stack([torch.randperm(20_000, generator=gen) for _ in range(4)]) + 1
    x = -1.1 * torch.log(ranks.float())
    rows = [(1.0, 0, 0.95, 0.0), (1.0, 0, 0.97, 0.0), (1.2, 0, 0.95, 0.0), (0.9, 0, 0.99, 0.0)]
    assert _paths(x, rows, KernelConfig(hist_bins=128)) == (0, 0, 0)


def test_a_bracket_too_wide_for_the_candidates_falls_back_exactly():
    """A bracket whose narrowest window (v*'s estimated bin alone, with 16 bins) still holds more
    than CAP entries takes the exact search: counted, same tokens."""
    gen = torch.Generator().manual_seed(8)
    x = logits("randn", len(TOP_P_ALONE), 1000, gen)
    assert _paths(x, TOP_P_ALONE, KernelConfig(hist_bins=16, cap=8, small=4, splits=2, block=64,
                                               scan_cols=64))[2] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_full_size_batch_matches_reference_on_gpu():
    gen = torch.Generator().manual_seed(6)
    x = logits("randn", 32, 151_936, gen)
    rows = [CONFIGS[i % len(CONFIGS)] for i in range(32)]
    tokens, valid = check(x, rows)
    assert bool(valid.all()) and len(set(tokens.tolist())) > 1      # real draws, not guard fallbacks


@pytest.mark.parametrize("rows", [[GREEDY], [TEMPERATURE, GREEDY], [(0.8, 50, 0.9, 0.0)], [(0.8, 0, 1.0, 0.05)],
                                  [(0.8, 0, 0.9, 0.0)], [(0.8, 0, 0.9, 0.05), GREEDY], [(0.8, 40, 0.9, 0.05)],
                                  CONFIGS], ids=lambda r: str(len(r)) + "_rows_" + str(r[0]))
def test_row_hints_name_what_the_batch_holds_alike_from_host_and_device_parameters(rows):
    """The kernels' hints from host-side parameters (the Sampler's, the ops') and from the
    parameter tensors agree field by field, and the top-p-with-min-p hint is set exactly when
    a row has top-p and min-p without top-k."""
    import numpy as np

    from tpsample.kernels.sample import hints_from_params
    from tpsample.sampling.kernel_backend import hints_from_host
    from tpsample.state.rows import HostRows
    t, k, p, lmp = params(rows)
    n = len(rows)
    host = HostRows(t.numpy(), k.numpy().astype(np.int64), p.numpy(), np.array([r[3] for r in rows], np.float32),
                    np.full(n, -1), np.zeros(n, bool), np.zeros(n, bool))
    from_host, from_params = hints_from_host(host, 1000), hints_from_params(t, k, p, lmp, 1000)
    assert from_host == from_params
    assert from_host.any_top_p_alone == any(r[0] > 0 and r[1] == 0 and r[2] < 1 for r in rows)


def test_unknown_hints_turn_on_every_path_and_known_bits_round_trip():
    """The ops' hints = -1 (device tensors, traced calls): every hint is on. Known bits
    round-trip field by field."""
    import dataclasses

    from tpsample.ops.table import HINT_FIELDS, hints_from_bits, hints_to_bits
    unknown = hints_from_bits(-1)
    assert all(getattr(unknown, f) for f in HINT_FIELDS)
    assert [f.name for f in dataclasses.fields(unknown)] == list(HINT_FIELDS)
    for bits in (0, 1, 0b10101, 0b11111, 0b10000):
        assert hints_to_bits(hints_from_bits(bits)) == bits


SIGMA_ROWS = [((0.8, 0, 1.0, 0.0), 1.0), ((1.0, 0, 1.0, 0.0), 0.3), ((0.8, 50, 0.9, 0.0), 2.0), ((0.8, 0, 0.9, 0.0), 1.5),
              ((0.8, 0, 1.0, 0.05), 3.0), ((1.0, 3, 1.0, 0.0), 0.5), (GREEDY, 1.0), (TEMPERATURE, 0.0),
              ((0.9, 200, 0.9, 0.01), 0.25), ((0.7, 0, 0.95, 0.0), -1.0)]


def check_sigma(x, rows, cfg=DEFAULT, seed=0):
    """`check` with top-n-sigma: rows are ((temperature, top_k, top_p, min_p), n_sigma)."""
    t, k, p, lmp = params([r for r, _ in rows])
    n_sigma = torch.tensor([n for _, n in rows], dtype=torch.float32)
    k0, k1 = row_keys(len(rows), seed)
    got = sample_rows(x.to(DEV), t.to(DEV), k.to(DEV), p.to(DEV), lmp.to(DEV), k0.to(DEV), k1.to(DEV), cfg=cfg,
                      n_sigma=n_sigma.to(DEV))
    want = torch_ref.sample_rows(x, t, k, p, lmp, k0, k1, n_sigma=n_sigma)
    assert got[0].cpu().tolist() == want[0].tolist(), (rows, got, want)
    assert got[1].cpu().tolist() == want[1].tolist(), (rows, got, want)
    return want


@pytest.mark.parametrize("kind,cfg", [("randn", DEFAULT), ("randn", SEARCH), ("randn", SPLIT), ("zipf", SPLIT),
                                      ("ties", SEARCH)])
def test_top_n_sigma_rows_beside_every_other_kind_of_row_match_the_reference(kind, cfg):
    gen = torch.Generator().manual_seed(zlib.crc32(f"sigma/{kind}/{cfg.cap}".encode()) % 1000)
    x = logits(kind, len(SIGMA_ROWS), 300, gen) + torch.linspace(0, 6, 300)     # spread rows: sigma cuts deep
    x[::3, :40] = NEG_INF                                    # -inf entries are outside the statistics
    x[1, 7] = float("nan")
    changed = 0
    for seed in range(3):
        want = check_sigma(x, SIGMA_ROWS, cfg, seed)
        plain = torch_ref.sample_rows(x, *params([r for r, _ in SIGMA_ROWS]), *row_keys(len(SIGMA_ROWS), seed))
        changed += sum(a != b for a, b in zip(want[0].tolist(), plain[0].tolist()))
    assert changed > 0                                       # the threshold changed some tokens


def test_top_n_sigma_takes_l_from_the_whole_row_where_x_over_t_overflows():
    """A temperature below 1 sends x near -FLT_MAX to l = -inf, outside the statistics: the
    row's ends come from l, not from x's extremes (which would give a zero-width grid)."""
    x = torch.randn(6, 200, generator=torch.Generator().manual_seed(2)) * 0.05
    x[:, 5] = -3e38
    x[5, 9] = 3e38                                  # and l = +inf: kept, and it wins
    rows = [((0.5, 0, 1.0, 0.0), 3.0), ((0.5, 0, 0.99, 0.0), 2.0), ((0.7, 100, 1.0, 0.0), 3.0)] * 2
    tokens = check_sigma(x, rows, SPLIT)[0]
    assert (tokens != x.argmax(dim=1)).sum() >= 2        # rows kept more than their max

def test_a_batch_without_top_n_sigma_launches_what_it_did_and_one_with_it_one_pass_more(monkeypatch):
    """The skip flag: no n_sigma, no sigma pass and no SIGMA code in the scan or the select; with
    it, the same launches and the sigma pass between the scan and the select."""
    from tpsample.kernels import launcher
    launched = []
    at = launcher.Launcher.at

    def record(self, site, grid, *args, **constexprs):
        launched.append((self.fn.__name__, constexprs.get("SIGMA")))
        return at(self, site, grid, *args, **constexprs)

    monkeypatch.setattr(launcher.Launcher, "at", record)
    rows = [(0.8, 50, 0.9, 0.0), (0.8, 0, 0.9, 0.0), (0.8, 0, 1.0, 0.05), GREEDY]
    x = logits("randn", len(rows), 300, torch.Generator().manual_seed(3))
    check(x, rows)
    without = list(launched)
    launched.clear()
    check_sigma(x, [(r, 1.0) for r in rows])
    names = [name for name, _ in without]
    assert names == ["scan_kernel", "select_kernel", "hist_kernel", "list_kernel", "hist_kernel", "round_kernel",
                     "finish_kernel", "drain_kernel"]
    assert all(flag in (None, False) for _, flag in without)
    assert [name for name, _ in launched] == names[:1] + ["sigma_sums_kernel"] + names[1:]
    assert [flag for name, flag in launched if name in ("scan_kernel", "select_kernel")] == [True, True]
