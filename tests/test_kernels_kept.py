"""The kept pass of `kernels.sample.sample_rows` (kept.py): each asked row's kept count and
bounds, and XTC's upper bound and redraw, exactly the reference's on every threshold path
(candidates, exact search, list, lean, bracket, masked draw), under TRITON_INTERPRET=1 on CPU.
"""
import zlib

import pytest
import torch

pytest.importorskip("triton")

import kernels_torch_ref as torch_ref
from test_kernels_sample import CONFIGS, DEFAULT, DEV, NO_LIST, SEARCH, SPLIT, logits, params, row_keys

from tpsample.kernels.sample import Kept, KernelConfig, sample_rows

pytestmark = [pytest.mark.usefixtures("triton_interpreter"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]
INF = float("inf")
PATHS = [DEFAULT, SEARCH, SPLIT, KernelConfig(**NO_LIST), KernelConfig(force={"bracket"}, **NO_LIST)]


def reference(x, rows, seed, xtc):
    """Per row (token, count, smallest, largest, upper) of the kept values; xtc: per row the
    threshold of a row whose coin came up, or None."""
    t, k, p, lmp = params(rows)
    k0, k1 = row_keys(len(rows), seed)
    shift = torch_ref.mass_shift(x.shape[1])
    tokens = torch_ref.sample_rows(x, t, k, p, lmp, k0, k1)[0].tolist()
    out = []
    for r, (temp, top_k, top_p, _) in enumerate(rows):
        if temp == 0:
            l = torch_ref.transform(x[r:r + 1])[0]
            kept = l > -INF
        else:
            l, kept = torch_ref.kept_row(x[r], temp, top_k, top_p, float(lmp[r]), shift)
        upper = INF if temp == 0 or xtc[r] is None else torch_ref.xtc_row(l, kept, xtc[r], shift)
        if upper < INF:
            kept &= l <= upper
            tokens[r] = torch_ref.draw(l, kept, int(k0[r]), int(k1[r]), 0)
        n = int(kept.sum())
        out.append((tokens[r], n, float(l[kept].min()) if n else -INF, float(l[kept].max()) if n else -INF, upper))
    return out


def kept_pass(x, rows, cfg, seed, xtc):
    """The kernels' (token, count, smallest, largest, upper) per row, every row asked."""
    t, k, p, lmp = params(rows)
    k0, k1 = row_keys(len(rows), seed)
    ask = Kept(torch.arange(len(rows), device=DEV))
    if any(v is not None for v in xtc):
        ask = Kept(ask.rows, torch.tensor([v or 0.0 for v in xtc], device=DEV),
                   torch.tensor([v is not None for v in xtc], device=DEV))
    got = sample_rows(x.to(DEV), *(v.to(DEV) for v in (t, k, p, lmp, k0, k1)), cfg=cfg, kept=ask)
    token, _, count, low, top, upper = (v.cpu().tolist() for v in got)
    return [(token[r], count[r], low[r] if count[r] else -INF, top[r], upper[r]) for r in range(len(rows))]


@pytest.mark.parametrize("kind", ["randn", "zipf", "ties"])
@pytest.mark.parametrize("cfg", PATHS, ids=["default", "search", "split", "lean", "bracket"])
def test_the_kept_pass_gives_every_rows_kept_count_and_bounds_on_every_threshold_path(kind, cfg):
    gen = torch.Generator().manual_seed(zlib.crc32(f"kept/{kind}".encode()) % 1000)
    x = logits(kind, len(CONFIGS), 400, gen)
    x[5, ::37] = float("nan")
    x[16, ::13] = -INF
    none = [None] * len(CONFIGS)
    assert kept_pass(x, CONFIGS, cfg, 0, none) == reference(x, CONFIGS, 0, none)


@pytest.mark.parametrize("cfg", PATHS, ids=["default", "search", "split", "lean", "bracket"])
def test_xtc_rows_are_redrawn_under_the_reference_upper_bound(cfg):
    """Rows whose coin came up drop every top choice but the least probable one (and take the
    reference's token under that bound); rows whose coin did not keep their own draw."""
    gen = torch.Generator().manual_seed(31)
    x = logits("zipf", len(CONFIGS), 400, gen) * 4
    xtc = [(0.0, 0.01, 0.05, 0.2, None)[i % 5] for i in range(len(CONFIGS))]
    changed = 0
    for seed in range(2):
        want = reference(x, CONFIGS, seed, xtc)
        assert kept_pass(x, CONFIGS, cfg, seed, xtc) == want
        plain = reference(x, CONFIGS, seed, [None] * len(CONFIGS))
        changed += sum(a[0] != b[0] for a, b in zip(want, plain))
    assert changed > 0 and any(w[4] < INF for w in want)


def test_a_batch_without_a_kept_pass_launches_what_it_did_and_one_with_it_one_kernel_more(monkeypatch):
    """The skip flag: no `kept`, no kept kernel and no KEPT code in the finish, list and drain
    kernels; with it, the same launches with KEPT on, then the kept kernel."""
    from tpsample.kernels import launcher
    launched = []
    at = launcher.Launcher.at

    def record(self, site, grid, *args, **constexprs):
        launched.append((self.fn.__name__, constexprs.get("KEPT")))
        return at(self, site, grid, *args, **constexprs)

    monkeypatch.setattr(launcher.Launcher, "at", record)
    rows = [(0.8, 50, 0.9, 0.0), (0.8, 0, 0.9, 0.0), (0.8, 0, 1.0, 0.05), (0.0, 0, 1.0, 0.0)]
    x = logits("randn", len(rows), 300, torch.Generator().manual_seed(3))
    kept_pass(x, rows, DEFAULT, 0, [None] * 4)
    with_kept = list(launched)
    launched.clear()
    t, k, p, lmp = params(rows)
    sample_rows(*(v.to(DEV) for v in (x, t, k, p, lmp, *row_keys(len(rows), 0))))
    names = [name for name, _ in launched]
    assert names == ["scan_kernel", "select_kernel", "hist_kernel", "list_kernel", "hist_kernel", "round_kernel",
                     "finish_kernel", "drain_kernel"]
    assert all(flag in (None, False) for _, flag in launched)
    assert [name for name, _ in with_kept] == names + ["kept_kernel"]
    assert [flag for name, flag in with_kept if name in ("list_kernel", "finish_kernel", "drain_kernel")] == [True] * 3


def test_per_lane_ptx_runs_only_where_every_entry_has_a_thread_of_its_own():
    """Inline PTX atomics run once per thread holding an entry: a small list (a search config's
    16 slots over the list kernel's 256 threads) repeats each entry over threads, and each copy
    would claim a slot (the kernels' kept threshold went below the reference's on CUDA)."""
    from tpsample.kernels.sample.launch import lane_ptx
    assert not lane_ptx(True, 2 * SEARCH.cap, 8) and not lane_ptx(True, 2 * SPLIT.cap, 8)
    assert lane_ptx(True, 2 * DEFAULT.cap, 8) and lane_ptx(True, 1024, 4)
    assert not lane_ptx(False, 2 * DEFAULT.cap, 8)


def test_steps_whose_block_maxima_lie_below_the_kept_set_are_skipped_without_changing_any_row():
    """On rows several kept-pass steps wide, a top-k / top-p row's kept set is a few blocks: the
    pass reads only the steps and blocks whose scan maximum reaches the threshold, and the kept
    counts, bounds and XTC redraws stay the reference's (a block whose maximum is the smallest
    kept value is read)."""
    rows = [(0.8, 5, 1.0, 0.0), (0.8, 0, 0.9, 0.0), (1.0, 3, 0.5, 0.2), (0.8, 50, 0.9, 0.0), (1.0, 0, 1.0, 0.05),
            (0.9, 200, 0.9, 0.01)]
    x = logits("zipf", len(rows), 5000, torch.Generator().manual_seed(7)) * 4
    for xtc in ([None] * len(rows), [0.0, 0.01, 0.0, 0.05, 0.0, 0.01]):
        assert kept_pass(x, rows, DEFAULT, 1, xtc) == reference(x, rows, 1, xtc)
