"""Sampler outputs, and the per-request assembly of per-row results (spec decode aware).

Assembly runs on the device with tensor ops (no loop over requests). A `SamplerOutput` holds
the results on the device plus, on CUDA, one pinned host copy started without waiting; its host
fields (`sampled_token_ids`, `num_sampled`, ...) wait for that copy the first time they are
read, so `Sampler.sample` itself never synchronises. `device_*` fields give the device tensors
(an engine can feed the sampled ids straight into the next step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

NUM_COUNT_COLUMNS = 4      # num_sampled, num_rejected, num_nans, num_fallback after the tokens


@dataclass
class LogprobsOutput:
    token_ids: torch.Tensor     # [rows, 1 + n] int64: column 0 the sampled token, then the top-n (-1 pad)
    logprobs: torch.Tensor      # [rows, 1 + n] fp32 (-inf pad)
    ranks: torch.Tensor         # [rows] int64: rank of the sampled token (1 = most likely)


@dataclass(frozen=True)
class RequestRows:
    """Where each request's rows are: index [num_reqs, max_rows] int64 batch rows (0 padded),
    valid [num_reqs, max_rows] bool, num_rows [num_reqs] int64; all on the device."""
    index: torch.Tensor
    valid: torch.Tensor
    num_rows: torch.Tensor

    @staticmethod
    def build(rows_per_req: np.ndarray, max_rows: int, device) -> "RequestRows":
        start = np.cumsum(rows_per_req) - rows_per_req
        j = np.arange(max_rows)[None, :]
        valid = j < rows_per_req[:, None]
        index = np.where(valid, start[:, None] + j, 0)
        packed = torch.from_numpy(np.concatenate([index, valid, rows_per_req[:, None]], axis=1).astype(np.int64))
        if torch.device(device).type == "cuda":
            packed = packed.pin_memory()
        packed = packed.to(device, non_blocking=True)
        return RequestRows(packed[:, :max_rows], packed[:, max_rows:2 * max_rows].bool(), packed[:, -1])


def assemble(emitted: torch.Tensor, accepted: torch.Tensor, fallback: torch.Tensor, num_nans: torch.Tensor,
             layout: Optional[RequestRows], max_rows: int) -> torch.Tensor:
    """Per-request packed block [num_reqs, max_rows + 4] int64 (device) from per-row results.

    Rows come request by request (drafts first, bonus row last). A request emits its accepted
    draft tokens up to the first rejection, then that row's emitted token (the residual), or,
    if every draft is accepted, the bonus row's token. Columns: tokens (-1 pad), num_sampled,
    num_rejected, num_nans, num_fallback (rows that emitted a token through the guard).
    layout None: one row per request (no drafts in the step).
    """
    if layout is None:
        ones = torch.ones_like(emitted)
        return torch.stack([emitted, ones, ones - 1, num_nans, fallback.to(torch.int64)], dim=1)
    idx, valid = layout.index, layout.valid
    is_draft = torch.arange(max_rows, device=idx.device).unsqueeze(0) < (layout.num_rows - 1).unsqueeze(1)
    acc = accepted[idx] & is_draft
    k = torch.cumprod(acc.to(torch.int64), dim=1).sum(dim=1)         # leading accepted drafts
    emit = (torch.arange(max_rows, device=idx.device).unsqueeze(0) <= k.unsqueeze(1)) & valid
    tokens = torch.where(emit, emitted[idx], torch.full_like(idx, -1))
    nans = (num_nans[idx] * valid).sum(dim=1)
    fb = (fallback[idx] & emit).sum(dim=1)
    return torch.cat([tokens, torch.stack([k + 1, layout.num_rows - 1 - k, nans, fb], dim=1)], dim=1)


class SamplerOutput:
    """One step's results, identical on every rank, in batch order.

    sampled_token_ids [num_reqs, max_rows] int64 (-1 = padding), num_sampled / num_rejected /
    num_nans / num_fallback [num_reqs] int64, logprobs (LogprobsOutput, rows in batch order) or
    None. These host tensors are ready on first access (a wait for the step's one copy).
    """

    def __init__(self, block: torch.Tensor, max_rows: int, logprobs: Optional[LogprobsOutput] = None):
        self.device_block = block                          # [num_reqs, max_rows + 4] int64
        self.max_rows = max_rows
        self.device_logprobs = logprobs
        self._host: Optional[tuple] = None
        self._ready: Optional[torch.cuda.Event] = None
        self._pending: Optional[tuple] = None
        if block.is_cuda:
            self._start_copy()

    def _start_copy(self) -> None:
        parts = [self.device_block.reshape(-1)]
        lp = self.device_logprobs
        if lp is not None:
            parts += [lp.token_ids.reshape(-1), lp.logprobs.reshape(-1).view(torch.int32).to(torch.int64),
                      lp.ranks.reshape(-1)]
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        host = torch.empty(flat.shape, dtype=torch.int64, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        self._ready = torch.cuda.Event()
        self._ready.record()
        self._pending = (host, flat)

    def _materialise(self) -> tuple:
        if self._host is None:
            if self._pending is None:          # CPU: the device tensors are host tensors
                block, lp = self.device_block, self.device_logprobs
            else:
                self._ready.synchronize()
                host = self._pending[0]
                n = self.device_block.numel()
                block = host[:n].view(self.device_block.shape)
                lp = None
                if self.device_logprobs is not None:
                    d = self.device_logprobs
                    a, b = n + d.token_ids.numel(), n + 2 * d.token_ids.numel()
                    lp = LogprobsOutput(host[n:a].view(d.token_ids.shape),
                                        host[a:b].to(torch.int32).view(torch.float32).view(d.logprobs.shape),
                                        host[b:].view(d.ranks.shape))
                self._pending = None
            m = self.max_rows
            self._host = (block[:, :m], block[:, m], block[:, m + 1], block[:, m + 2], block[:, m + 3], lp)
        return self._host

    @property
    def sampled_token_ids(self) -> torch.Tensor:
        return self._materialise()[0]

    @property
    def num_sampled(self) -> torch.Tensor:
        return self._materialise()[1]

    @property
    def num_rejected(self) -> torch.Tensor:
        return self._materialise()[2]

    @property
    def num_nans(self) -> torch.Tensor:
        return self._materialise()[3]

    @property
    def num_fallback(self) -> torch.Tensor:
        return self._materialise()[4]

    @property
    def logprobs(self) -> Optional[LogprobsOutput]:
        return self._materialise()[5]

    @property
    def device_sampled_token_ids(self) -> torch.Tensor:
        """[num_reqs, max_rows] int64 on the logits' device (no wait)."""
        return self.device_block[:, : self.max_rows]

    @property
    def device_num_sampled(self) -> torch.Tensor:
        return self.device_block[:, self.max_rows]

    def is_ready(self) -> bool:
        """True when the host fields can be read without waiting."""
        return self._ready is None or self._ready.query()

    def tokens(self, i: int) -> list[int]:
        """The tokens request i emitted this step."""
        return self.sampled_token_ids[i, : int(self.num_sampled[i])].tolist()

    def token_lists(self) -> list[list[int]]:
        """Every request's emitted tokens, in batch order."""
        ids, n = self.sampled_token_ids.tolist(), self.num_sampled.tolist()
        return [row[:k] for row, k in zip(ids, n)]
