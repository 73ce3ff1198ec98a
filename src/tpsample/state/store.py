"""RequestStore: every active request's sampling state, per slot, written once at add time.

Contract:
- `RequestStore(vocab_size, max_num_reqs, eos_token_id, processors)`: the processors
  (`sampling.processors.PROCESSORS`, passed in by the layer above) declare the per-slot columns
  and padded lists they keep; the dense tables' columns are laid out once from them
  (`state.columns.Layout`).
- `add(req_id, params, prompt, seed)` (inputs already validated) allocates a slot, writes the
  request's core parameters and, for each processor the request uses, its columns and lists
  and its flag bit. Nothing per request happens again until `remove`. An add that fails leaves
  the store as it was (no slot taken, no row changed); the slot keeps the request's print
  (`state.digest`) for the TP agreement check.
- `sync(device, need)`: once per step, before rows are built: one copy per table that changed.
- `row_batch(rows, device)`: the `RowBatch` of the given rows, by tensor ops over slot indices.
- `append(slots, tokens, num_sampled)`: the emitted tokens into the device history.
- Tables are replicated on every rank and identical there (same adds, same sampled tokens).
Memory per slot (device): a few bytes per dense parameter; 4 bytes per history token; and only
for requests that use them, each processor's lists (e.g. 8 bytes per logit-bias entry,
ceil(V/32) x 4 bytes for an allowed set, 4 bytes per stop id / bad-word token / distinct prompt
token). No table has a `[slots, V]` count: penalty counts come from the history itself, so no
rank holds per-vocabulary state whatever the strategy.
History (`History`): `tokens` [slots, capacity + 1] int32 holds each request's emitted tokens
(-1 after the end; the last column is scratch that masked writes land in), `ordered` the same
tokens ascending (what the penalty kernel searches, kept only for the slots of requests with
penalties), `num_out` [slots] int64 counts them; all updated on the device from the sampled ids.
The host keeps only bounds of each slot's length: `upper` (each step emits at most a request's
rows), which sizes the table and the per-step views, and `steps` (each step emits at least one
token), which tells which min_tokens bans may still apply, without reading the device.
Never imports sampling math, parallel strategies or kernels.
"""
from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import NamedTuple, Optional

import numpy as np
import torch

from ..noise import seed_to_int64
from ..params import LOGIT_MODES, PROCESSED_MODES, SamplingParams
from .columns import LP_LOGITS, LP_LOGPROBS, LP_TEMPERATURE, Layout
from .digest import request_digests, request_print
from .rows import RowBatch, build_row_batch
from .slots import RequestInfo, SlotTable
from .tables import DenseTable, PaddedTable, _grown, _np_dtype


class _Row(NamedTuple):
    """A request's rows, converted to the tables' dtypes before it takes a slot."""
    f32: np.ndarray                 # the dense float parameters, by layout
    i64: np.ndarray                 # the dense integer parameters (seed, top_k, ..., flags)
    stage: dict                     # padded table name -> its row
    digests: np.ndarray             # per digested field (state.digest)


class RequestStore:
    def __init__(self, vocab_size: int, max_num_reqs: int, eos_token_id: Optional[int], processors: tuple):
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.processors = tuple(processors)
        self.layout = Layout.of(self.processors)
        self.slots = SlotTable(max_num_reqs)
        self.f32 = DenseTable(np.array(self.layout.f32_fill, dtype=np.float32))
        self.i64 = DenseTable(np.array(self.layout.i64_fill, dtype=np.int64))
        words = (vocab_size + 31) // 32
        self.padded = {name: PaddedTable(dtype, fill, min_capacity=words if cap is None else cap)
                       for p in self.processors for name, (dtype, fill, cap) in p.tables.items()}
        self.history = History()
        self._flags_row: tuple = (None, None)      # (the i64 device table, its flags row)
        self._ordered_bits = self.layout.bits.get("penalties", 0)   # whose slots keep the ascending history
        self.device: Optional[torch.device] = None
        self._synced: Optional[tuple] = None      # (device, rows) of the last sync while nothing was added since

    # -- requests -----------------------------------------------------------------------------
    def add(self, req_id: str, params: SamplingParams, prompt: list[int], seed: int) -> RequestInfo:
        """Take a slot for the request and write its state (inputs validated); its record.

        Transactional: every value is converted to its table's dtype before a slot is taken, so
        a value that does not fit raises with nothing changed; a failure while writing puts the
        slot's rows back and frees the slot (`SlotTable.reserving`): the store is as before."""
        row = self._prepare(req_id, params, prompt, seed)
        with self.slots.reserving(req_id) as slot, self._restored_on_failure(slot):
            self._write(slot, row)
            info = RequestInfo(req_id, slot, params, seed, list(prompt), lambda: self.history.read(slot),
                               row.digests)
            self.slots.register(info, request_print(row.digests))
            self.history.reset(slot)            # last: it changes nothing unless it completes
        self._synced = None
        return info

    def _prepare(self, req_id: str, p: SamplingParams, prompt: list[int], seed: int) -> _Row:
        """The request's table rows, in the tables' dtypes (pure: raises before any state changes)."""
        layout = self.layout
        f32 = np.array(layout.f32_fill, dtype=np.float32)
        i64 = np.array(layout.i64_fill, dtype=np.int64)
        greedy = p.temperature == 0
        core = {"temperature": p.temperature, "top_p": 1.0 if greedy else p.top_p,
                "min_p": 0.0 if greedy else p.min_p, "top_n_sigma": 0.0 if greedy else max(p.top_n_sigma, 0.0),
                "xtc_threshold": p.xtc_threshold, "xtc_probability": 0.0 if greedy else p.xtc_probability,
                "seed": seed_to_int64(seed),
                "top_k": 0 if greedy or p.top_k <= 0 or p.top_k >= self.vocab_size else p.top_k,
                "prompt_len": len(prompt), "num_logprobs": -1 if p.logprobs is None else p.logprobs,
                "processed": int(p.logprobs_mode in PROCESSED_MODES), "lp_kind": lp_kind(p.logprobs_mode),
                "kept_cap": -1 if p.kept_support is None else p.kept_support}
        stage, flags = {}, 0
        for proc in self.processors:
            got = proc.stage(p, prompt, self.vocab_size, self.eos_token_id)
            if got is not None:
                flags |= layout.bits[proc.name]
                core.update(got)
        core["flags"] = flags
        for name, value in core.items():
            if name in layout.f32:
                f32[layout.f32[name]] = value
            elif name in layout.i64:
                i64[layout.i64[name]] = value
            else:
                stage[name] = np.asarray(value, dtype=_np_dtype(self.padded[name].dtype))
        return _Row(f32, i64, stage, request_digests(req_id, p, seed, prompt, self.vocab_size))

    @contextlib.contextmanager
    def _restored_on_failure(self, slot: int) -> Iterator[None]:
        """If the body raises, `slot`'s rows (dense columns, staged lists, print) are put back."""
        self.f32.ensure_rows(self.slots.high_water)     # growth adds fill-valued columns only
        self.i64.ensure_rows(self.slots.high_water)
        saved = (self.f32.host[:, slot].copy(), self.i64.host[:, slot].copy(),
                 [table.row_state(slot) for table in self.padded.values()], int(self.slots.prints[slot]))
        try:
            yield
        except BaseException:
            f32, i64, states, print_value = saved
            self.f32.write_column(slot, f32)
            self.i64.write_column(slot, i64)
            for table, state in zip(self.padded.values(), states):
                table.restore_row(state)
            self.slots.prints[slot] = print_value
            raise

    def _write(self, slot: int, row: _Row) -> None:
        """Prepared rows into `slot` (its tables already hold the slot: `_restored_on_failure`)."""
        for name, table in self.padded.items():
            table.stage(slot, row.stage.get(name, ()))
        self.f32.write_column(slot, row.f32)
        self.i64.write_column(slot, row.i64)

    def remove(self, req_id: str) -> None:
        self.slots.remove(req_id)

    # -- per step -----------------------------------------------------------------------------
    def sync(self, device: torch.device, need_history: int) -> None:
        """Device tables current (staged writes flushed) with room for `need_history` tokens."""
        rows = self.slots.high_water
        if self._synced == (device, rows) and need_history <= self.history.capacity:
            return                       # nothing was added and the history has room: all current
        self.device = device
        self.f32.sync(device)
        self.i64.sync(device)
        for table in self.padded.values():
            table.sync(device, rows)
        self.history.sync(device, rows, need_history)
        self._synced = (device, rows)

    def row_batch(self, rows, device: torch.device) -> RowBatch:
        """The RowBatch of `rows` (a `RowsView`: slots, draft offsets, draft tokens per row)."""
        return build_row_batch(self, rows, device)

    def append(self, slots: torch.Tensor, tokens: torch.Tensor, num_sampled: torch.Tensor, kernel=None) -> None:
        """The history append of a step; only slots of requests with penalties keep the
        ascending copy (its only reader is the penalty kernel)."""
        table = self.i64.device_table
        if self._flags_row[0] is not table:     # one view per table: no call per step
            self._flags_row = (table, table[self.layout.i64["flags"]])
        self.history.append(slots, tokens, num_sampled, kernel, (self._flags_row[1], self._ordered_bits))


def lp_kind(mode: str) -> int:
    """The lp_kind column of a logprobs_mode (the processed column says which row)."""
    return LP_LOGITS if mode in LOGIT_MODES else LP_TEMPERATURE if mode == "temperature_logprobs" else LP_LOGPROBS


def derive_seed(base_seed: int, req_id: str, serial: int) -> int:
    """A request seed from the sampler's base seed, the request id and its add-order serial.

    Pure function of replicated values, so every rank derives the same seed without talking.
    """
    h = hashlib.blake2b(f"{base_seed}:{serial}:{req_id}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


class History:
    def __init__(self):
        self.tokens: Optional[torch.Tensor] = None   # [rows, cap + 1] int32, emission order
        self.ordered: Optional[torch.Tensor] = None  # [rows, cap + 1] int32, ascending (-1 past the end)
        self.num_out: Optional[torch.Tensor] = None  # [rows] int64
        self.upper = np.zeros(16, dtype=np.int64)    # host upper bound of num_out per slot
        self.steps = np.zeros(16, dtype=np.int64)    # host lower bound of num_out per slot
        self._reset: list[int] = []
        self.full_views = False     # per-step views span the whole capacity (see `full_width`)

    @contextlib.contextmanager
    def full_width(self):
        """While a step is recorded into a CUDA graph: per-step history views (penalty counts,
        bad words) span the whole capacity instead of the longest current history, so the
        recorded shapes stay valid for the tokens appended by later replays."""
        self.full_views = True
        try:
            yield
        finally:
            self.full_views = False

    def view_width(self, slots: np.ndarray) -> int:
        """Columns of a per-step view of these slots' histories."""
        if self.full_views:
            return self.capacity
        return int(self.upper[slots].max()) if len(slots) else 0

    @property
    def capacity(self) -> int:
        return 0 if self.tokens is None else self.tokens.shape[1] - 1

    def reset(self, slot: int) -> None:
        """A new request takes `slot`: its history is empty (applied at the next sync)."""
        if slot >= len(self.upper):
            size = _grown(len(self.upper), slot + 1)
            self.upper = np.concatenate([self.upper, np.zeros(size - len(self.upper), np.int64)])
            self.steps = np.concatenate([self.steps, np.zeros(size - len(self.steps), np.int64)])
        self.upper[slot] = 0
        self.steps[slot] = 0
        self._reset.append(slot)

    def sync(self, device: torch.device, rows: int, need: int) -> None:
        """Tables on `device` with >= rows slots and room for `need` tokens per slot; resets applied."""
        if self.tokens is not None and self.tokens.device != device:
            self.tokens, self.ordered, self.num_out = (t.to(device) for t in (self.tokens, self.ordered, self.num_out))
        cap = max(self.capacity, 64)
        cap = _grown(cap, need)
        nrows = _grown(16, max(rows, 1 if self.tokens is None else self.tokens.shape[0]))
        if self.tokens is None or cap > self.capacity or nrows > self.tokens.shape[0]:
            tokens = torch.full((nrows, cap + 1), -1, dtype=torch.int32, device=device)
            ordered = torch.full_like(tokens, -1)
            num_out = torch.zeros(nrows, dtype=torch.int64, device=device)
            if self.tokens is not None:
                r, c = self.tokens.shape
                tokens[:r, : c - 1] = self.tokens[:, : c - 1]
                ordered[:r, : c - 1] = self.ordered[:, : c - 1]
                num_out[:r] = self.num_out
            self.tokens, self.ordered, self.num_out = tokens, ordered, num_out
        if self._reset:
            idx = torch.tensor(self._reset, dtype=torch.int64).to(device, non_blocking=True)
            self.num_out.index_fill_(0, idx, 0)
            self.tokens.index_fill_(0, idx, -1)
            self.ordered.index_fill_(0, idx, -1)
            self._reset.clear()

    def rows(self, slots: torch.Tensor, width: int) -> torch.Tensor:
        """[n, width] int64 histories of the given slots, -1 past each one's length."""
        h = self.tokens.index_select(0, slots)[:, :width].to(torch.int64)
        n = self.num_out.index_select(0, slots)
        past = torch.arange(width, device=h.device).unsqueeze(0) >= n.unsqueeze(1)
        return h.masked_fill_(past, -1)

    def append(self, slots: torch.Tensor, tokens: torch.Tensor, num_sampled: torch.Tensor, kernel=None,
               ordered_flags=None) -> None:
        """history[slot] += tokens[i, :num_sampled[i]] for each request i (device ops only), in
        emission order and in the ascending copy.

        slots: [num_reqs] int64 (distinct); tokens: [num_reqs, max_rows] int64; num_sampled:
        [num_reqs] int64. kernel: an equivalent single-launch implementation
        (`kernels.step_ops.append_history`). ordered_flags: None (every slot keeps the
        ascending copy) or (flags [slots] int64, mask): only slots with flags & mask keep it.
        """
        if slots.numel() == 0:
            return
        if kernel is not None:
            kernel(self.tokens, self.ordered, self.num_out, slots, tokens, num_sampled, ordered_flags)
            return
        width = tokens.shape[1]
        start = self.num_out.index_select(0, slots)
        pos = start.unsqueeze(1) + torch.arange(width, device=tokens.device).unsqueeze(0)
        keep = torch.arange(width, device=tokens.device).unsqueeze(0) < num_sampled.unsqueeze(1)
        pos = torch.where(keep, pos, torch.full_like(pos, self.capacity))       # masked -> scratch
        rows = slots.unsqueeze(1).expand_as(pos)
        self.tokens.index_put_((rows, pos), tokens.to(torch.int32))
        self.num_out.index_add_(0, slots, num_sampled)
        # the ascending copy of the touched rows: -1 (past the end) sorts last
        h = self.tokens.index_select(0, slots)[:, : self.capacity]
        top = torch.iinfo(torch.int32).max
        ordered = torch.where(h < 0, top, h).sort(dim=1).values
        ordered = torch.where(ordered == top, -1, ordered)
        if ordered_flags is not None:       # the other slots' copies stay as they are (-1)
            flags, mask = ordered_flags
            keep = (flags.index_select(0, slots) & mask) != 0
            ordered = torch.where(keep.unsqueeze(1), ordered, self.ordered.index_select(0, slots)[:, : self.capacity])
        self.ordered[:, : self.capacity].index_copy_(0, slots, ordered)

    def note_step(self, slots: np.ndarray, rows_per_req: np.ndarray) -> None:
        """Host bookkeeping for a sampled step: each request emits 1 to rows_per_req tokens."""
        self.upper[slots] += rows_per_req
        self.steps[slots] += 1

    def read(self, slot: int) -> list[int]:
        if self.tokens is None or slot >= self.tokens.shape[0] or slot in self._reset:
            return []                      # not sampled since it was (re)added
        n = int(self.num_out[slot])
        return self.tokens[slot, :n].tolist()
