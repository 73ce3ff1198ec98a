"""The ops' kernel route: `sample` over full rows on a kernel device without a bitmask, launched
straight from the per-row tensors, and after a site's first call from its launch list.

Contract:
- `sample_direct(x, params, hints, num_logprobs)`: `table.sample_full`'s six tensors for full rows
  on a kernel device (`table.kernel_path`) with no bitmask and raw logprobs or none. params: the
  six per-row tensors (T, top-k, top-p, min-p, seeds, positions) in any dtype and layout, not
  yet normalised. The same kernels and inputs as the Sampler's kernel path: one launch that
  normalises the parameters and keys the noise, the sampling launches, with logprobs the
  statistics pass and the kernel laying the rows out, and one launch for the outputs.
- Launch lists: through `replay.launch_at`, the policy every recording follows. A *site* is
  x's shape, strides, dtype and 16-byte alignment, each parameter's alignment, the hints, the
  logprob count, the device and the stream; later calls of a site issue its recorded launches
  with the new tensors' pointers: the same kernels with the same arguments, so the same
  results bit for bit, without Triton binding each argument (most of an eager call's host
  time). Outputs are new tensors on every call; intermediates live in buffers kept per site
  (`stream_scratch`, and the launch list's own references).
"""
from __future__ import annotations

import torch

from ..kernels.launcher import raw_stream, stream_scratch
from ..noise import SALT_DRAW
from ..replay import buffer_key, launch_at
from .table import hints_from_bits

_SITES: dict = {}       # site -> LaunchList, or the number of its refused recordings (`replay.launch_at`)
_LP_COLUMNS = {"NUM_LP": 0, "PROCESSED": 1}     # rows of `_lp_rows`'s table
_DTYPES = (torch.float32, torch.int64, torch.float32, torch.float32, torch.int64, torch.int64)


def given(params, dev) -> tuple:
    """The six parameters as contiguous [R] fp32 (T, top-p, min-p) / int64 tensors on dev."""
    return tuple(v.to(dev, dt).contiguous() for v, dt in zip(params, _DTYPES))


def _outputs(n: int, width: int, dev) -> tuple:
    i64 = torch.int64
    return (torch.empty(n, dtype=i64, device=dev), torch.empty(n, dtype=torch.bool, device=dev),
            torch.empty(n, dtype=i64, device=dev), torch.empty((n, width), dtype=i64, device=dev),
            torch.empty((n, width), dtype=torch.float32, device=dev), torch.empty(n, dtype=i64, device=dev))


def _lp_table(lp: int, dev) -> torch.Tensor:
    t = torch.zeros((2, 1), dtype=torch.int64, device=dev)     # fills, no copy: allowed in a graph capture
    t[0] = lp
    return t


def _lp_rows(n: int, lp: int, dev) -> tuple:
    """(table [2, 1] int64 = (lp, raw), slots [R] zeros): every row wants lp raw logprobs."""
    return stream_scratch(dev, ("ops_lp", n, lp), lambda: (_lp_table(lp, dev),
                                                           torch.zeros(n, dtype=torch.int64, device=dev)))


def _launch(x, params: tuple, hints: int, lp: int, outs: tuple, lp_rows) -> None:
    """The route's launches, writing into `outs` (`_outputs`)."""
    from ..kernels import step_ops
    from ..kernels.sample import sample_rows
    from ..kernels.stats import raw_logprobs, token_logprob_stats
    n, dev = x.shape[0], x.device
    bufs, valid = stream_scratch(dev, ("ops_rows", n), lambda: (step_ops.row_buffers(n, dev),
                                                                 torch.empty(n, dtype=torch.bool, device=dev)))
    rows = step_ops.prepare_given(*params, x.shape[1], SALT_DRAW, out=bufs)
    tokens, fallback, counts, ids, vals, ranks = outs
    _, valid, nans = sample_rows(x, *rows, hints=hints_from_bits(hints), nans_out="partials", out=(tokens, valid))
    step_ops.split_outputs(tokens, valid, x, nans, out=(fallback, counts, ranks))
    if lp >= 0:
        lse, top_v, top_i, above = token_logprob_stats(x, None, lp, tokens=tokens)
        raw_logprobs(tokens, x, 0, lse, top_v, top_i, above, lp_rows[0], lp_rows[1], _LP_COLUMNS, lp + 1,
                     out=(ids, vals, ranks))


def sample_direct(x: torch.Tensor, params, hints: int, num_logprobs: int = -1) -> tuple:
    """(tokens [R] int64, fallback [R] bool, num_nans [R] int64, lp_ids [R, W] int64,
    lp_vals [R, W] fp32, lp_ranks [R] int64), W = num_logprobs + 1 (0 without logprobs)."""
    n, dev = x.shape[0], x.device
    params = given(params, dev)
    lp = num_logprobs
    outs = _outputs(n, lp + 1 if lp >= 0 else 0, dev)
    if n == 0:
        return outs
    lp_rows = _lp_rows(n, lp, dev) if lp >= 0 else None
    site = (buffer_key(x), raw_stream(dev), hints, lp, tuple(p.data_ptr() & 15 == 0 for p in params))
    launch_at(_SITES, site, [x, *params, *outs], 1 + len(params),
              lambda: _launch(x, params, hints, lp, outs, lp_rows))
    return outs
