"""Per-row parameters laid out as the Sampler's per-slot tables, one slot per row (or request).

Contract:
- `RowTable.build(...)` takes normalised per-row tensors (`args.normalise`) on the logits'
  device and writes them into `[params, n]` fp32 / int64 tables with the Sampler's column
  layout (`state.columns`, its core columns): seed, top-k, `prompt_len` = the position, no outputs, no
  processors. So `position = prompt_len + num_out + draft offset` is the caller's position (plus
  the draft offset of a verify row), and the noise is keyed exactly as the Sampler keys it.
- `row_batch(view, device)` is `RequestStore.row_batch`'s signature: the strategies and the
  sampling recipe (`sampling.recipe.sample_rows`, the kernels' `prepare_rows`) run on it unchanged.
- host: the rows' parameters as numpy (`HostRows`) when known. When they are not (device
  tensors on the kernel path, which needs only the kernels' hints), conservative stand-ins
  (every filter possibly on) and the caller's hints fill them; `ops.run` reads the device
  instead wherever the torch pipeline would decide from them.
- The identity view (every row, no drafts) needs no upload: `arange` on the device, so a call
  can be recorded in a CUDA graph.
Never imports `parallel` (the strategies call into it) or the Sampler.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..kernels.launcher import RowHints
from ..state.columns import Layout
from ..state.rows import HostRows, RowBatch, RowSource, RowsView, upload

LAYOUT = Layout.of(())     # the core columns: the ops' processors are ops of their own
HINT_FIELDS = ("any_filter", "any_top_k_or_p", "any_greedy", "any_plain", "any_top_p_alone")


def hints_from_bits(bits: int) -> RowHints:
    """RowHints from a bit field (bit i = HINT_FIELDS[i]; higher bits are ignored); -1: unknown,
    every hint on."""
    if bits < 0:
        return RowHints()
    return RowHints(*(bool(bits >> i & 1) for i in range(len(HINT_FIELDS))))


def hints_to_bits(h: RowHints) -> int:
    return sum(int(getattr(h, f)) << i for i, f in enumerate(HINT_FIELDS))


def identity_view(n: int) -> RowsView:
    """Every row of a table once, in order, with no drafts."""
    return RowsView(np.arange(n, dtype=np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64))


class RowTable:
    def __init__(self, f32: torch.Tensor, i64: torch.Tensor, host: dict, vocab_size: int,
                 hints: Optional[RowHints]):
        self.f32, self.i64, self.vocab_size = f32, i64, vocab_size
        self.size = f32.shape[1]
        self.num_out = torch.zeros(self.size, dtype=torch.int64, device=f32.device)
        self.host = host               # name -> [n] numpy (parameters possibly stand-ins)
        self.hints = hints             # set when host holds stand-ins: the kernels' hints

    @staticmethod
    def build(temperature, top_k, top_p, min_p, seeds, positions, *, num_logprobs: int, processed: bool,
              vocab_size: int, host: Optional[dict], hints: int = -1) -> "RowTable":
        """Normalised [n] tensors; host: the same values as numpy (None: unknown, see module doc)."""
        n, dev = temperature.shape[0], temperature.device
        lp = torch.full((n,), num_logprobs, dtype=torch.int64, device=dev)
        none = torch.zeros(n, dtype=torch.int64, device=dev)
        f32 = _stack(LAYOUT.f32, {"temperature": temperature, "top_p": top_p, "min_p": min_p})
        i64 = _stack(LAYOUT.i64, {"seed": seeds, "top_k": top_k, "prompt_len": positions, "num_logprobs": lp,
                                  "processed": none + int(processed), "flags": none})
        known = host is not None
        if not known:       # stand-ins that only widen what the torch pipeline would look at
            host = {"temperature": np.ones(n, np.float32), "top_k": np.full(n, vocab_size, np.int64),
                    "top_p": np.full(n, 0.5, np.float32), "min_p": np.full(n, 0.5, np.float32)}
        host = dict(host, num_logprobs=np.full(n, num_logprobs, np.int64), processed=np.full(n, processed))
        return RowTable(f32, i64, host, vocab_size, None if known else hints_from_bits(hints))

    def row_batch(self, view: RowsView, device) -> RowBatch:
        n = view.num_rows
        if self._is_identity(view):
            slots = torch.arange(n, device=device)
            offsets = torch.zeros(n, dtype=torch.int64, device=device)
            drafts = torch.full((n,), -1, dtype=torch.int64, device=device)
        else:
            slots, offsets, drafts = upload([view.slots, view.offsets, view.draft_tokens], torch.device(device))
        h = {k: v[view.slots] for k, v in self.host.items()}
        host = HostRows(temperature=h["temperature"], top_k=h["top_k"], top_p=h["top_p"], min_p=h["min_p"],
                        num_logprobs=h["num_logprobs"], processed=h["processed"], has_draft=view.draft_tokens >= 0)
        if self.hints is not None:      # the kernels decide from these, never from the stand-ins
            host.memo[("hints", self.vocab_size)] = self.hints
        wants = host.num_logprobs >= 0
        source = RowSource(self.f32, self.i64, self.num_out, slots, offsets, LAYOUT)
        return RowBatch(num_rows=n, vocab_size=self.vocab_size, source=source, draft_tokens=drafts, host=host,
                        lp_raw_rows=_rows(wants & ~host.processed, device),
                        lp_proc_rows=_rows(wants & host.processed, device), origin=(self, view, device))

    def _is_identity(self, view: RowsView) -> bool:
        n = view.num_rows
        return (n == self.size and view.drafts_before is None and not (view.draft_tokens >= 0).any()
                and not view.offsets.any() and np.array_equal(view.slots, np.arange(n)))


def _stack(columns: dict, values: dict) -> torch.Tensor:
    """[len(columns), n] the named rows in the layout's order; a column not given holds its "off"
    value (the Sampler-only filters: the ops do not take them)."""
    like = next(iter(values.values()))
    fill = dict(zip(LAYOUT.f32, LAYOUT.f32_fill)) | dict(zip(LAYOUT.i64, LAYOUT.i64_fill))
    return torch.stack([values[name] if name in values else torch.full_like(like, fill[name])
                        for name in sorted(columns, key=columns.get)])


def _rows(mask: np.ndarray, device) -> Optional[torch.Tensor]:
    """Device indices of the rows in `mask` (all rows: an arange, no upload); None for none."""
    if not mask.any():
        return None
    if mask.all():
        return torch.arange(len(mask), device=device)
    return upload([np.flatnonzero(mask)], torch.device(device))[0]
