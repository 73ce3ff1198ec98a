"""RequestStore: every active request's sampling state, per slot, written once at add time.

Contract:
- `add(req_id, params, prompt, seed)` (inputs already validated) allocates a slot, writes the
  request's parameters into the dense tables' host mirrors and stages its sparse lists: logit
  bias, the allowed-id bitmask, min_tokens stop ids (+ EOS), bad words, and the prompt's token
  set for the repetition penalty. Nothing per request happens again until `remove`. An add that
  fails leaves the store as it was (no slot taken, no row changed); the slot keeps the request's
  print (`state.digest`) for the TP agreement check.
- `sync(device, need)`: once per step, before rows are built: one copy per table that changed.
- `row_batch(rows, device)`: the `RowBatch` of the given rows, by tensor ops over slot indices.
- `append(slots, tokens, num_sampled)`: the emitted tokens into the device history.
- Tables are replicated on every rank and identical there (same adds, same sampled tokens).
Memory per slot (device): 52 bytes of dense parameters; 4 bytes per history token; and only for
requests that use them, 8 bytes per logit-bias entry, ceil(V/32) x 4 bytes for an allowed set,
4 bytes per stop id / bad-word token / distinct prompt token (repetition penalty). No table has a
`[slots, V]` count: penalty counts come from the history itself, so no rank holds per-vocabulary
state whatever the strategy.
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
from ..params import SamplingParams
from .columns import F_ALLOWED, F_BAD, F_BIAS, F_FREQ, F_REP, F_STOPS, FLAGS, FREQ, MIN_P, PRES, REP, TOP_P, T  # noqa: F401
from .digest import request_digests, request_print
from .history import History
from .rowbatch import RowBatch
from .rows import build_row_batch
from .slots import RequestInfo, SlotTable
from .tables import DenseTable, PaddedTable, _np_dtype


class _Row(NamedTuple):
    """A request's rows, converted to the tables' dtypes before it takes a slot."""
    f32: np.ndarray                 # [6] dense float parameters
    i64: np.ndarray                 # [7] dense integer parameters (seed, top_k, ..., flags)
    stage: dict                     # padded table name -> its row
    longest: int                    # the longest bad word
    digests: np.ndarray             # per DIGEST_FIELDS entry (state.digest)


class RequestStore:
    def __init__(self, vocab_size: int, max_num_reqs: int, eos_token_id: Optional[int]):
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.slots = SlotTable(max_num_reqs)
        self.f32 = DenseTable(6, np.float32, 0.0)
        self.i64 = DenseTable(7, np.int64, 0)
        words = (vocab_size + 31) // 32
        self.padded = {
            "bias_tokens": PaddedTable(torch.int32, -1), "bias_values": PaddedTable(torch.float32, 0.0),
            "allowed": PaddedTable(torch.int32, 0, min_capacity=words), "stops": PaddedTable(torch.int32, -1),
            "bad_tokens": PaddedTable(torch.int32, -1), "bad_starts": PaddedTable(torch.int32, -1),
            "bad_lens": PaddedTable(torch.int32, 0), "prompt_set": PaddedTable(torch.int32, -1),
        }
        self.bad_longest = np.zeros(16, dtype=np.int64)
        self.history = History()
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
        greedy = p.temperature == 0
        top_k = 0 if greedy or p.top_k <= 0 or p.top_k >= self.vocab_size else p.top_k
        f32 = np.array([p.temperature, 1.0 if greedy else p.top_p, 0.0 if greedy else p.min_p,
                        p.repetition_penalty, p.frequency_penalty, p.presence_penalty], dtype=np.float32)
        stage, flags, longest = self._lists(p, prompt)
        i64 = np.array([seed_to_int64(seed), top_k, len(prompt), -1 if p.logprobs is None else p.logprobs,
                        int(p.logprobs_mode == "processed"), p.min_tokens, flags], dtype=np.int64)
        stage = {name: np.asarray(v, dtype=_np_dtype(self.padded[name].dtype)) for name, v in stage.items()}
        return _Row(f32, i64, stage, longest, request_digests(req_id, p, seed, prompt, self.vocab_size))

    @contextlib.contextmanager
    def _restored_on_failure(self, slot: int) -> Iterator[None]:
        """If the body raises, `slot`'s rows (dense columns, staged lists, print) are put back."""
        self.f32.ensure_rows(self.slots.high_water)     # growth adds fill-valued columns only
        self.i64.ensure_rows(self.slots.high_water)
        if slot >= len(self.bad_longest):
            self.bad_longest = np.resize(self.bad_longest, max(2 * len(self.bad_longest), slot + 1))
        saved = (self.f32.host[:, slot].copy(), self.i64.host[:, slot].copy(), int(self.bad_longest[slot]),
                 [table.row_state(slot) for table in self.padded.values()], int(self.slots.prints[slot]))
        try:
            yield
        except BaseException:
            f32, i64, longest, states, print_value = saved
            self.f32.write_column(slot, f32)
            self.i64.write_column(slot, i64)
            self.bad_longest[slot] = longest
            for table, state in zip(self.padded.values(), states):
                table.restore_row(state)
            self.slots.prints[slot] = print_value
            raise

    def _write(self, slot: int, row: _Row) -> None:
        """Prepared rows into `slot` (its tables already hold the slot: `_restored_on_failure`)."""
        for name, values in row.stage.items():
            self.padded[name].stage(slot, values)
        self.bad_longest[slot] = row.longest
        self.f32.write_column(slot, row.f32)
        self.i64.write_column(slot, row.i64)

    def _lists(self, p: SamplingParams, prompt: list[int]) -> tuple[dict, int, int]:
        """(the padded tables' rows {name: values}, the feature flags, the longest bad word); pure."""
        stage = {name: () for name in self.padded}
        flags = 0
        if p.logit_bias:
            stage["bias_tokens"], stage["bias_values"] = list(p.logit_bias), list(p.logit_bias.values())
            flags |= F_BIAS
        if p.allowed_token_ids is not None:
            ids = np.asarray(sorted(set(p.allowed_token_ids)), dtype=np.int64)
            words = np.zeros((self.vocab_size + 31) // 32, dtype=np.int64)
            np.bitwise_or.at(words, ids // 32, np.left_shift(1, ids % 32))
            stage["allowed"] = words.astype(np.uint32).view(np.int32)
            flags |= F_ALLOWED
        stops = set(p.stop_token_ids or ())
        if self.eos_token_id is not None and not p.ignore_eos:
            stops.add(self.eos_token_id)
        if p.min_tokens > 0 and stops:
            stage["stops"] = sorted(stops)
            flags |= F_STOPS
        words = p.bad_words_token_ids or ()
        if words:
            lens = [len(w) for w in words]
            stage["bad_tokens"] = [t for w in words for t in w]
            stage["bad_starts"] = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
            stage["bad_lens"] = lens
            flags |= F_BAD
        if p.repetition_penalty != 1.0:
            stage["prompt_set"] = np.unique(np.asarray(prompt, dtype=np.int64))
            flags |= F_REP
        if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            flags |= F_FREQ
        return stage, flags, max((len(w) for w in words), default=0)

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
        """The history append of a step; only slots with penalties keep the ascending copy (its
        only reader is the penalty kernel)."""
        self.history.append(slots, tokens, num_sampled, kernel, (self.i64.device_row(FLAGS), F_REP | F_FREQ))


def derive_seed(base_seed: int, req_id: str, serial: int) -> int:
    """A request seed from the sampler's base seed, the request id and its add-order serial.

    Pure function of replicated values, so every rank derives the same seed without talking.
    """
    h = hashlib.blake2b(f"{base_seed}:{serial}:{req_id}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")
