"""Sampler outputs: the results on the device and their one host copy.

A `SamplerOutput` holds
the results on the device plus their host copy: every result tensor (the packed block and, with
logprobs, ids, ranks and values) goes to the host in ONE device-to-host copy of their bytes
(`HostLayout`). Its host fields (`sampled_token_ids`, `num_sampled`, ...) wait for that copy the
first time they are read, so sampling itself never synchronises. `device_*` fields give the
device tensors (an engine can feed the sampled ids straight into the next step).

Two ways the copy is made:
- eager (`SamplerOutput(block, max_rows, logprobs)`, what `Sampler.sample` returns): on CUDA the
  constructor starts a non-blocking copy into a fresh pinned buffer and records an event.
- shared (`SamplerOutput.from_shared(results)`, what a captured step's `replay()` returns): the
  CUDA graph itself copies into one persistent pinned buffer (`ReplayResults`) that every replay
  reuses. An output never hands out that buffer: reading it copies the bytes out first, and
  before the next replay overwrites the buffer, `ReplayResults.release()` gives the previous
  output, if it is still alive and unread, its own copy (see there). Its `device_*` fields are
  the graph's static tensors: like any CUDA-graph output they hold the next replay's values
  once that replay runs.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


@dataclass
class LogprobsOutput:
    token_ids: torch.Tensor     # [rows, 1 + n] int64: column 0 the sampled token, then the top-n (-1 pad)
    logprobs: torch.Tensor      # [rows, 1 + n] fp32 (-inf pad)
    ranks: torch.Tensor         # [rows] int64: rank of the sampled token (1 = most likely)


@dataclass
class KeptSupport:
    """Each row's kept support (what it could have sampled: the tokens kept by steps 7-9 and XTC;
    a greedy row: its token), for RL trainers' sampling masks. A token t is kept iff its value
    v in the row after the temperature (steps 1-6) is finite and threshold <= v <= upper."""
    token_ids: torch.Tensor     # [rows, cap] int64: kept tokens, most probable first (ties -> lower id), -1 pad
    count: torch.Tensor         # [rows] int64: how many tokens were kept (-1: the request did not ask)
    threshold: torch.Tensor     # [rows] fp32: the smallest kept value (-inf: none kept)
    upper: torch.Tensor         # [rows] fp32: its upper bound (+inf unless XTC removed the top tokens)


_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32}


class HostLayout:
    """Where a step's result tensors lie in one flat byte buffer, so they travel in one copy.

    Parts: the block, then (with logprobs) token ids, ranks and values, each at a byte offset
    that is a multiple of its element size (larger elements first), so the host views them in
    place. `pack` gives the flat bytes on the device (a view of the block when it is alone and
    contiguous: no kernel); `unpack` gives numpy views of a host copy of those bytes."""

    def __init__(self, block: torch.Tensor, logprobs: Optional[LogprobsOutput], support: Optional[KeptSupport] = None):
        self.parts, at, last = [], 0, 8
        self.has = (logprobs is not None, support is not None)
        for t in _parts(block, logprobs, support):
            size = t.element_size()
            if size > last or t.dtype not in _NUMPY:
                raise ValueError(f"result tensors: int64 / int32 / fp32, largest first, got {t.dtype} after "
                                 f"{last}-byte elements")
            n = t.numel() * size
            self.parts.append((at, at + n, np.dtype(_NUMPY[t.dtype]), tuple(t.shape)))
            at, last = at + n, size
        self.nbytes = at

    def matches(self, block: torch.Tensor, logprobs: Optional[LogprobsOutput]) -> bool:
        return HostLayout(block, logprobs).parts == self.parts

    @staticmethod
    def pack(block: torch.Tensor, logprobs: Optional[LogprobsOutput], support: Optional[KeptSupport] = None
             ) -> torch.Tensor:
        """[nbytes] uint8 on the results' device."""
        parts = [_bytes(t) for t in _parts(block, logprobs, support)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def unpack(self, host: np.ndarray) -> tuple[np.ndarray, Optional[LogprobsOutput]]:
        """(block numpy, logprobs as CPU tensors or None): views of `host`, the packed bytes."""
        return self.unpack_all(host)[:2]

    def unpack_all(self, host: np.ndarray) -> tuple[np.ndarray, Optional[LogprobsOutput], Optional[KeptSupport]]:
        """(block numpy, logprobs and kept supports as CPU tensors or None): views of `host`."""
        views = [host[a:b].view(dtype).reshape(shape) for a, b, dtype, shape in self.parts]
        block, rest = views[0], [torch.from_numpy(v) for v in views[1:]]
        has_lp, has_support = self.has
        lp = support = None
        if has_lp:       # int64 parts first, then fp32 (see _parts)
            lp_ids, lp_ranks = rest.pop(0), rest.pop(0)
        if has_support:
            s_ids, s_count = rest.pop(0), rest.pop(0)
        if has_lp:
            lp = LogprobsOutput(lp_ids, rest.pop(0), lp_ranks)
        if has_support:
            support = KeptSupport(s_ids, s_count, rest.pop(0), rest.pop(0))
        return block, lp, support


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """t's elements in row-major order as [numel x itemsize] uint8 (a view when t is dense in that
    order; strides of size-1 dimensions can be anything, e.g. a [1, k] view of a transpose)."""
    flat = t.reshape(-1)
    if flat.numel() <= 1:
        flat = flat.as_strided(flat.shape, (1,))
    elif flat.stride(0) != 1:
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def _parts(block: torch.Tensor, logprobs: Optional[LogprobsOutput], support: Optional[KeptSupport] = None) -> tuple:
    """The result tensors, 8-byte elements first: block, logprob ids and ranks, support ids and
    counts, then logprob values, support thresholds and upper bounds (what is there)."""
    lp = () if logprobs is None else (logprobs.token_ids, logprobs.ranks)
    ks = () if support is None else (support.token_ids, support.count)
    lp4 = () if logprobs is None else (logprobs.logprobs,)
    ks4 = () if support is None else (support.threshold, support.upper)
    return (block, *lp, *ks, *lp4, *ks4)


class SamplerOutput:
    """One step's results, identical on every rank, in batch order.

    sampled_token_ids [num_reqs, max_rows] int64 (-1 = padding), num_sampled / num_rejected /
    num_nans / num_fallback [num_reqs] int64, logprobs (LogprobsOutput, rows in batch order) or
    None, kept_support (KeptSupport, rows in batch order) or None. These host tensors are ready on first access (a wait for the step's one copy); on a
    device they are this output's own copy: no later step or replay changes them.
    """

    def __init__(self, block: torch.Tensor, max_rows: int, logprobs: Optional[LogprobsOutput] = None,
                 kept_support: Optional[KeptSupport] = None):
        self._setup(block, max_rows, logprobs, kept_support)
        if block.is_cuda:
            self._start_copy()

    def _setup(self, block, max_rows, logprobs, kept_support=None) -> None:
        self.device_block = block                          # [num_reqs, max_rows + 4] int64
        self.max_rows = max_rows
        self.device_logprobs = logprobs
        self.device_kept_support = kept_support            # rows in batch order, like logprobs
        self._np: Optional[np.ndarray] = None              # the host block, once there
        self._host_lp: Optional[LogprobsOutput] = None
        self._host_support: Optional[KeptSupport] = None
        self._host: Optional[tuple] = None                 # the host fields, built on first access
        self._ready: Optional[torch.cuda.Event] = None     # the copy this output waits for
        self._pending: Optional[tuple] = None              # (layout, host bytes, device bytes) of that copy
        self._shared: Optional[ReplayResults] = None       # shared mode: the captured step's buffer

    @classmethod
    def from_shared(cls, results: "ReplayResults") -> "SamplerOutput":
        """The output of a replay: its graph copied the results into `results.host`, and
        `results.event` was recorded after it (nothing is copied or recorded here)."""
        out = cls.__new__(cls)
        out._setup(results.block, results.max_rows, results.logprobs)
        out._shared, out._ready = results, results.event
        return out

    def _start_copy(self) -> None:
        """Eager: one non-blocking copy of every result into a fresh (pinned, on CUDA) host buffer."""
        layout = HostLayout(self.device_block, self.device_logprobs, self.device_kept_support)
        self._copy_out(layout, layout.pack(self.device_block, self.device_logprobs, self.device_kept_support))

    def _copy_out(self, layout: HostLayout, flat: torch.Tensor) -> None:
        cuda = flat.is_cuda
        host = torch.empty(layout.nbytes, dtype=torch.uint8, pin_memory=cuda)
        host.copy_(flat, non_blocking=cuda)
        self._ready = None
        if cuda:
            self._ready = torch.cuda.Event()
            self._ready.record()
        self._pending = (layout, host, flat)           # flat stays alive until the copy is read

    def _detach(self) -> None:
        """Shared mode, before the next replay overwrites the shared buffer: make this output
        independent of it. Its replay finished (or no device): copy the host bytes now. Still
        running: queue a copy of the graph's device bytes into a buffer of its own, on the stream
        ahead of the next replay, so the host never waits here."""
        results = self._shared
        if results is None or self._np is not None:
            return
        if self._ready is None or self._ready.query():
            self._np, self._host_lp = results.layout.unpack(results.host_np.copy())
        else:
            self._copy_out(results.layout, results.staging)
        self._shared = None

    def _host_block(self) -> np.ndarray:
        """The host block [num_reqs, max_rows + 4] int64 (numpy), waiting for the copy once."""
        if self._np is None:
            if self._shared is not None:        # shared buffer: copy the bytes out (the next replay reuses it)
                if self._ready is not None:
                    self._ready.synchronize()
                self._np, self._host_lp = self._shared.layout.unpack(self._shared.host_np.copy())
                self._shared = None
            elif self._pending is not None:     # a buffer of its own
                if self._ready is not None:
                    self._ready.synchronize()
                layout, host, _ = self._pending
                self._np, self._host_lp, self._host_support = layout.unpack_all(host.numpy())
                self._pending = None
            else:                               # CPU: the device tensors are host tensors
                self._np, self._host_lp = self.device_block.numpy(), self.device_logprobs
                self._host_support = self.device_kept_support
        return self._np

    def _materialise(self) -> tuple:
        if self._host is None:
            block, m = torch.from_numpy(self._host_block()), self.max_rows
            self._host = (block[:, :m], block[:, m], block[:, m + 1], block[:, m + 2], block[:, m + 3], self._host_lp)
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
        self._host_block()          # no tensor views of the block: reading this costs no torch op
        return self._host_lp

    @property
    def kept_support(self) -> Optional[KeptSupport]:
        """Each row's kept support (rows in batch order), or None when no request asked."""
        self._host_block()
        return self._host_support

    @property
    def device_sampled_token_ids(self) -> torch.Tensor:
        """[num_reqs, max_rows] int64 on the logits' device (no wait)."""
        return self.device_block[:, : self.max_rows]

    def tokens(self, i: int) -> list[int]:
        """The tokens request i emitted this step."""
        b = self._host_block()
        return b[i, : b[i, self.max_rows]].tolist()

    def token_lists(self) -> list[list[int]]:
        """Every request's emitted tokens, in batch order (numpy views: no tensor op per call)."""
        b, m = self._host_block(), self.max_rows
        if m == 1:              # no drafts: every request emits exactly its one row's token
            return b[:, :1].tolist()
        return [row[:k] for row, k in zip(b[:, :m].tolist(), b[:, m].tolist())]


class ReplayResults:
    """The host side of a captured step: one persistent host buffer (pinned on CUDA) that the
    graph's own device-to-host copy refills on every replay, and one event recorded after each.

    Per replay: `release()` before the graph runs, then the graph, then `publish()`. `fill()` is
    the copy itself (pack, then one copy): called once inside the capture, the graph repeats it
    (on CPU tensors a test calls it where a replay would run). The buffer is never handed out:
    an output copies its bytes out when first read, and `release()` first makes the previous
    output, if still referenced and unread, independent of it (`SamplerOutput._detach`: a copy of
    a few KiB on the host when that replay has finished, else a copy queued on the stream ahead
    of the next replay, so an unread output never makes the host wait). An output nobody holds
    any more is skipped (a weak reference)."""

    def __init__(self, block: torch.Tensor, max_rows: int, logprobs: Optional[LogprobsOutput]):
        self.block, self.max_rows, self.logprobs = block, max_rows, logprobs
        self.layout = HostLayout(block, logprobs)
        cuda = block.is_cuda
        self.host = torch.empty(self.layout.nbytes, dtype=torch.uint8, pin_memory=cuda)
        self.host_np = self.host.numpy()           # the same memory
        self.event = torch.cuda.Event() if cuda else None
        self.staging: Optional[torch.Tensor] = None   # the packed device bytes (the graph's static tensor)
        self._last: Optional[weakref.ref] = None

    def bind(self, block: torch.Tensor, logprobs: Optional[LogprobsOutput]) -> None:
        """Take the results the graph writes (same shapes as the ones the buffer was sized for)."""
        if not self.layout.matches(block, logprobs):
            raise ValueError("the captured step's results differ in shape from the warm-up step's")
        self.block, self.logprobs = block, logprobs

    def fill(self) -> None:
        """Pack the results and copy them into the host buffer."""
        self.staging = self.layout.pack(self.block, self.logprobs)
        self.host.copy_(self.staging, non_blocking=self.staging.is_cuda)

    def release(self) -> None:
        """Before the buffer is overwritten: the previous output, if alive and unread, detaches."""
        last = self._last() if self._last is not None else None
        self._last = None
        if last is not None:
            last._detach()

    def publish(self) -> SamplerOutput:
        """After the graph was launched: record the event, return the replay's output."""
        if self.event is not None:
            self.event.record()
        out = SamplerOutput.from_shared(self)
        self._last = weakref.ref(out)
        return out
