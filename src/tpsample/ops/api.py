"""`sample` and `verify_drafts`: the Sampler's sampling as functions of per-row tensors.

The same code as the Sampler (docs/semantics.md steps 1, 2, 6-12; the processors of steps 3-5
are ops of their own), a `RowTable` standing in for its request store, so the noise is keyed by
(seed, position, token id) and a row's token never depends on its index, the other rows, the
strategy or TP. Every argument is checked on the host before any kernel or collective
(`ops.args`); all ranks must pass the same values, so every rank raises alike and none waits in
a collective. TP = 1: inside a torch.compile trace one `torch.ops.tpsample.sample` call (an
opaque node), eager its body called directly; either records in a CUDA graph, and on a kernel
device repeated calls of one shape replay their launch list (`ops.direct`). TP > 1: eager, the
Sampler's strategies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from ..params import PROCESSED_MODES, RANGES
from ..parallel import names
from ..parallel.collectives import Collectives
from ..parallel.group import DEFAULT_TIMEOUT_S, TPGroup
from ..parallel.shard import vocab_shard
from ..sampling.kernel_backend import hints_from_host
from ..sampling.output import LogprobsOutput
from ..state.rows import HostRows
from ..validation import check_bitmask, check_draft_probs, check_drafts
from . import args as A
from . import impl  # noqa: F401  (registers torch.ops.tpsample.*)
from .impl import host_params, sample_impl

from .table import RowTable, choose, hints_to_bits, sample_tp

MAX_DRAFTS = 63          # per request, as the Sampler's max_num_logits_per_req <= 64
OPS_LOGPROBS_MODES = ("raw", "processed", "raw_logprobs", "processed_logprobs")


@dataclass(frozen=True)
class Sampled:
    token_ids: torch.Tensor                  # [rows] int64
    logprobs: Optional[LogprobsOutput]       # token_ids / logprobs [rows, 1 + n], ranks [rows]; None: not asked
    num_nans: torch.Tensor                   # [rows] int64: NaN logits seen in the row (counted as -inf)
    fallback: torch.Tensor                   # [rows] bool: nothing finite was kept, the guard chose (step 12)


@dataclass(frozen=True)
class Verified:
    token_ids: torch.Tensor                  # [reqs, 1 + D] int64 emitted tokens, -1 padded
    num_sampled: torch.Tensor                # [reqs] int64: accepted drafts + 1
    num_rejected: torch.Tensor               # [reqs] int64: drafts not accepted
    num_fallback: torch.Tensor               # [reqs] int64: emitted rows the guard chose


def resolve_group(op: str, group, timeout_s: float = DEFAULT_TIMEOUT_S) -> TPGroup:
    """Exactly this group (None: TP = 1; never the implicit default group). No collective."""
    if isinstance(group, TPGroup):
        return group
    if group is None or (dist.is_available() and isinstance(group, dist.ProcessGroup)):
        return TPGroup.of(group, timeout_s)
    raise A.fail(op, "group", "None, a torch.distributed ProcessGroup or a TPGroup", type(group).__name__)


def check_vocab(op: str, vocab_size, cols: int, g: TPGroup) -> int:
    """V, and that the logits hold exactly this rank's shard of it."""
    if vocab_size is None:
        if g.size > 1:
            raise A.fail(op, "vocab_size", f"given when the group has more than one rank ({g.size})", None)
        vocab_size = cols
    vocab_size = A.check_int(op, "vocab_size", vocab_size, 1, 2**31 - 1)
    start, end = vocab_shard(vocab_size, g.size, g.rank)
    if cols != end - start:
        raise A.fail(op, "logits", f"this rank's shard of V = {vocab_size}: {end - start} columns "
                     f"(vocab_shard(V, {g.size}, {g.rank}))", f"{cols} columns")
    return vocab_size


def _row_params(op: str, rows: int, dev, validate: bool, **given) -> tuple[dict, Optional[dict]]:
    """{name: [rows] tensor on dev} and the host copies (None unless every one is known)."""
    out, host = {}, {}
    for name, value in given.items():
        out[name], host[name] = A.per_row(op, name, value, rows, dev)
    if validate:
        A.check_device_values(op, given)
    known = all(h is not None for h in host.values())
    return out, (host if known else None)


def _host_table(p: dict, host: Optional[dict], vocab_size: int, lp: int, processed: bool) -> RowTable:
    """A RowTable whose host parameters are exact (read from the device once when not known)."""
    t = p["temperature"]
    k, tp_, mp = A.normalise(t, p["top_k"], p["top_p"], p["min_p"], vocab_size)
    if host is not None:
        hk, hp, hm = A.normalise(host["temperature"], host["top_k"], host["top_p"], host["min_p"], vocab_size)
        exact = {"temperature": host["temperature"], "top_k": hk, "top_p": hp, "min_p": hm}
    else:
        exact = host_params(t, k, tp_, mp)
    return RowTable.build(t, k, tp_, mp, p["seeds"], p["positions"], num_logprobs=lp, processed=processed,
                          vocab_size=vocab_size, host=exact)


def _hints(host: Optional[dict], vocab_size: int) -> int:
    """The kernels' hints from host-known parameters (-1: unknown, every hint on)."""
    if host is None:
        return -1
    k, p, m = A.normalise(host["temperature"], host["top_k"], host["top_p"], host["min_p"], vocab_size)
    n = len(k)
    rows = HostRows(host["temperature"], k, p, m, np.full(n, -1), np.zeros(n, bool), np.zeros(n, bool))
    return hints_to_bits(hints_from_host(rows, vocab_size))


def _check_common(op: str, strategy, logprobs, logprobs_mode) -> tuple[int, bool]:
    if strategy not in names.ALL:
        raise A.fail(op, "strategy", f"one of {names.ALL}", strategy)
    top_n = RANGES["logprobs"]
    lp = -1 if logprobs is None else A.check_int(op, "logprobs", logprobs, top_n.lo, top_n.hi, top_n.allowed)
    if logprobs_mode not in OPS_LOGPROBS_MODES:
        raise A.fail(op, "logprobs_mode", f"one of {OPS_LOGPROBS_MODES} (the logits and temperature modes are "
                     "the Sampler's)", logprobs_mode)
    return lp, logprobs_mode in PROCESSED_MODES


def sample(logits: torch.Tensor, *, temperature, top_k=None, top_p=None, min_p=None, seeds, positions,
           group=None, strategy: str = "auto", vocab_size: Optional[int] = None, logprobs: Optional[int] = None,
           logprobs_mode: str = "raw", bitmask: Optional[torch.Tensor] = None, validate: bool = False) -> Sampled:
    """One token per row, bitwise the Sampler's for the same logits, seeds and positions.

    temperature: 0 (greedy) or [1e-6, 1e6]; top_k: None / 0 / -1 off, else >= 1 (>= V: off);
    top_p: None / 1 off, else (0, 1]; min_p: None / 0 off, else [2**-126, 1]; seeds: int64 (a
    Python int is taken mod 2**64); positions: int64 >= 0, the absolute position of the token
    being sampled (a request with a prompt of L tokens samples position L + step). Each a scalar
    or a [rows] tensor. logprobs: None, or n: the sampled token's logprob and rank and the top-n
    ("raw" / "raw_logprobs": of the logits as given, after the bitmask; "processed" /
    "processed_logprobs": after temperature and the filters). bitmask: optional int32 [rows, ceil(V/32)] grammar mask (bit = allowed), applied
    as the Sampler applies it (after counting NaNs; the guard keeps to it).
    group: the TP process group (None: TP = 1); then logits are this rank's shard and vocab_size
    is required. strategy: "auto", "replicated", "batch_sharded" or "vocab_parallel" ("auto": the
    cost model the Sampler uses, with its static constants for the device kind).
    validate: also check the value ranges of device tensors (one reduction and one device read;
    not inside torch.compile or CUDA-graph capture). Scalars and CPU tensors are always checked.
    """
    op = "tpsample.ops.sample"
    rows, cols = A.check_logits(op, logits)
    g = resolve_group(op, group)
    vocab = check_vocab(op, vocab_size, cols, g)
    lp, processed = _check_common(op, strategy, logprobs, logprobs_mode)
    if not isinstance(validate, bool):
        raise A.fail(op, "validate", "True or False", validate)
    check_bitmask(bitmask, rows, vocab, name="bitmask", op=op)
    p, host = _row_params(op, rows, logits.device, validate, temperature=temperature, top_k=top_k, top_p=top_p,
                          min_p=min_p, seeds=seeds, positions=positions)
    if g.size == 1:
        args = (logits, p["temperature"], p["top_k"], p["top_p"], p["min_p"], p["seeds"], p["positions"], bitmask, lp,
                processed, _hints(host, vocab))
        if A.tracing():                 # the custom op: one opaque node of the traced graph
            out = torch.ops.tpsample.sample(*args)
        else:                           # eager: its body, without the dispatcher's layers (tens of us)
            with torch.no_grad():
                out = sample_impl(*args)
        tokens, fallback, nans, ids, vals, ranks = out
        return Sampled(tokens, None if lp < 0 else LogprobsOutput(ids, vals, ranks), nans, fallback)
    table = _host_table(p, host, vocab, lp, processed)
    chosen = choose(strategy, table, g.size, vocab, logits.device, np.ones(rows, np.int64))
    block, logprobs = sample_tp(logits, table, chosen, Collectives(g), vocab, bitmask=bitmask,
                                width=lp + 1 if lp >= 0 else 0)
    return Sampled(block[:, 0].contiguous(), logprobs, block[:, 3].contiguous(), block[:, 4] > 0)


def _drafts(op: str, draft_token_ids, rows: int, vocab: int) -> np.ndarray:
    """[reqs, D] int64 (-1 padded) on the host, whose rows add up to the logits' rows."""
    if isinstance(draft_token_ids, (torch.Tensor, np.ndarray)):
        reqs = draft_token_ids.shape[0] if draft_token_ids.ndim == 2 else -1
    else:
        reqs = len(draft_token_ids) if isinstance(draft_token_ids, (list, tuple)) else -1
    if reqs < 0:
        raise A.fail(op, "draft_token_ids", "a list of lists of token ids or an int array [reqs, D]",
                     type(draft_token_ids).__name__)
    drafts = check_drafts(draft_token_ids, reqs, vocab, 1 + MAX_DRAFTS)
    need = reqs + int((drafts >= 0).sum())
    if need != rows:
        raise A.fail(op, "logits", f"one row per draft plus one bonus row per request ({need} rows)", f"{rows} rows")
    return drafts


def verify_drafts(logits: torch.Tensor, draft_token_ids, *, temperature, top_k=None, top_p=None, min_p=None,
                  seeds, positions, draft_probs: Optional[torch.Tensor] = None, group=None, strategy: str = "auto",
                  vocab_size: Optional[int] = None, validate: bool = False) -> Verified:
    """Speculative decoding's verification, as the Sampler verifies drafts (rejection sampling).

    Rows of logits, request by request: one per draft (the target row of that draft), then the
    bonus row. draft_token_ids: per request its drafts (list of lists, or an int array [reqs, D]
    padded with -1), on the host (it fixes the row layout). Parameters, seeds and positions are
    per request ([reqs] or scalars); positions: the position of the request's first draft. Row j
    of a request is sampled at position + j. Without draft_probs (n-gram drafts) a draft is
    accepted iff it equals the token `sample` emits at its position, and the first rejected row
    emits that token: a seeded request's tokens never depend on its drafts. With draft_probs
    ([rows, V_r], this rank's columns): accept iff u < p(x) / q(x), else a residual draw.
    """
    op = "tpsample.ops.verify_drafts"
    rows, cols = A.check_logits(op, logits)
    g = resolve_group(op, group)
    vocab = check_vocab(op, vocab_size, cols, g)
    _check_common(op, strategy, None, "raw")
    drafts = _drafts(op, draft_token_ids, rows, vocab)
    if draft_probs is not None:
        draft_rows = np.flatnonzero(_row_drafts(drafts) >= 0)
        check_draft_probs(draft_probs, rows, cols, draft_rows=draft_rows, full_rows=g.size == 1)
    p, host = _row_params(op, drafts.shape[0], logits.device, validate, temperature=temperature, top_k=top_k,
                          top_p=top_p, min_p=min_p, seeds=seeds, positions=positions)
    table = _host_table(p, host, vocab, -1, False)
    chosen = choose(strategy, table, g.size, vocab, logits.device, 1 + (drafts >= 0).sum(axis=1))
    b, _ = sample_tp(logits, table, chosen, Collectives(g), vocab, drafts=drafts, draft_probs=draft_probs)
    m = b.shape[1] - 4
    return Verified(b[:, :m].contiguous(), b[:, m].contiguous(), b[:, m + 1].contiguous(), b[:, m + 3].contiguous())


def _row_drafts(drafts: np.ndarray) -> np.ndarray:
    """The draft token each logits row verifies (-1: a bonus row), request by request."""
    out = []
    for row in drafts:
        d = row[row >= 0]
        out.extend(d.tolist() + [-1])
    return np.asarray(out, dtype=np.int64)
