"""Logits processors and logprobs an engine may call on their own (docs/semantics.md steps 2-5, 11):
`apply_penalties`, `apply_dry`, `apply_bias`, `apply_bitmask`, `logprobs`.

Contract:
- in: logits `[rows, cols]` (any float dtype) holding vocabulary columns
  `[col_start, col_start + cols)`: 0 for full rows, `vocab_shard(V, TP, rank)[0]` for a shard
  (the processors are column-local: under TP each rank calls them on its shard, no collective).
  Token lists are int tensors `[rows, K]` of global ids padded with -1 (padding anywhere).
- out: a new fp32 `[rows, cols]` tensor (the Sampler works on the same fp32 copy); the input is
  never written. Each is one `torch.ops.tpsample.*` call (traceable, capturable).
- semantics are the Sampler's processors' (`sampling.processors`), bit for bit. Applying them
  before `sample` gives the Sampler's tokens for rows where something finite is kept; only the
  guard (step 12) differs: it then picks the argmax after these processors, where the Sampler
  picks it after the grammar mask alone (pass the mask to `sample` to keep that rule).
- checks: shapes and dtypes always; values of CPU tensors and scalars (ranges as
  SamplingParams'); values of device tensors are the caller's.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..coerce import MAX_TOKEN_ID
from ..parallel.collectives import Collectives
from ..parallel.shard import vocab_shard
from ..parallel.strategies import ShardReducer
from ..params import MAX_DRY_BREAKER_LEN
from ..sampling.dry import FLOAT_MAX_LOG, max_exponent
from ..sampling.output import LogprobsOutput
from ..validation import is_token
from . import args as A
from . import impl  # noqa: F401  (registers torch.ops.tpsample.*)
from .api import check_vocab, resolve_group
from .impl import logprobs_impl


def _col_start(op: str, col_start) -> int:
    return A.check_int(op, "col_start", col_start, 0, 2**31 - 1)


def _ids(op: str, name: str, ids, rows: int) -> torch.Tensor:
    ids = A.check_ids(op, name, ids, rows, dims=2)
    if ids.device.type == "cpu" and not A.tracing() and bool((ids < -1).any()):
        raise A.fail(op, name, "token ids >= 0, or -1 for padding", ids[ids < -1][:5].tolist())
    return ids


def apply_penalties(logits: torch.Tensor, *, output_token_ids: torch.Tensor,
                    prompt_token_ids: Optional[torch.Tensor] = None, repetition=1.0, frequency=0.0,
                    presence=0.0, col_start: int = 0) -> torch.Tensor:
    """Repetition over the prompt and output tokens (`l > 0 ? l / r : l * r`), then frequency
    (`l -= f * count`) and presence (`l -= p`) over the output tokens, once per distinct token.

    output_token_ids: [rows, W] each row's generated tokens (-1 pad); their counts drive
    frequency. prompt_token_ids: [rows, P] (-1 pad; repeats allowed) for repetition, or None.
    repetition in [0.01, 100], frequency and presence in [-2, 2]: scalars or [rows] tensors."""
    op = "tpsample.ops.apply_penalties"
    rows, _ = A.check_logits(op, logits)
    out = _ids(op, "output_token_ids", output_token_ids, rows)
    prompt = None if prompt_token_ids is None else _ids(op, "prompt_token_ids", prompt_token_ids, rows)
    dev = logits.device
    r, _ = A.per_row(op, "repetition", repetition, rows, dev)
    f, _ = A.per_row(op, "frequency", frequency, rows, dev)
    p, _ = A.per_row(op, "presence", presence, rows, dev)
    return torch.ops.tpsample.apply_penalties(logits, out, prompt, r, f, p, _col_start(op, col_start))


def apply_dry(logits: torch.Tensor, context_token_ids: torch.Tensor, *, multiplier=0.8, base=1.75,
              allowed_length=2, penalty_last_n=-1, sequence_breakers=None, col_start: int = 0) -> torch.Tensor:
    """llama.cpp's DRY (`llama_sampler_dry_apply`, docs/semantics.md step 4): each token that would
    extend a repeat of the context's suffix of at least `allowed_length` tokens (within the last
    `penalty_last_n`, -1: all; cut at the most recent sequence breaker) gets
    `l -= multiplier * base ** (length - allowed_length)` (the exponent capped as llama.cpp caps it).

    context_token_ids: [rows, C] each row's context, oldest first (the prompt, the outputs, the
    drafts before the row), then -1 padding. multiplier in [0, 100] (0 = off), base in [1, 100],
    allowed_length in [0, 2**31), penalty_last_n -1, 0 (off) or >= 1: scalars or [rows] tensors.
    sequence_breakers: token id sequences (a head and up to 20 more tokens), the same for every
    row; a one-token breaker is never penalised."""
    op = "tpsample.ops.apply_dry"
    rows, _ = A.check_logits(op, logits)
    ctx = _ids(op, "context_token_ids", context_token_ids, rows)
    dev = logits.device
    named = {name: A.per_row(op, name, value, rows, dev) for name, value in (
        ("multiplier", multiplier), ("base", base), ("allowed_length", allowed_length),
        ("penalty_last_n", penalty_last_n))}
    single, multi = _breakers(op, sequence_breakers, rows, dev)
    base_t, base_host = named["base"]
    if base_host is not None:
        caps = {b: max_exponent(b) for b in np.unique(base_host).tolist()}
        max_exp = torch.tensor([caps[b] for b in base_host.tolist()], dtype=torch.int64, device=dev)
    else:
        ratio = torch.log(base_t).reciprocal_().mul_(float(FLOAT_MAX_LOG))
        max_exp = torch.where(base_t > float(np.float32(1.000001)), ratio, 0).to(torch.int64)
    return torch.ops.tpsample.apply_dry(logits, ctx, single, multi, named["multiplier"][0], base_t,
                                        named["allowed_length"][0], named["penalty_last_n"][0], max_exp,
                                        _col_start(op, col_start))


def _breakers(op: str, breakers, rows: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """(one-token breakers [rows, S], longer ones [rows, B * MAX_DRY_BREAKER_LEN]), -1 padded."""
    allowed = f"None or a list of token id sequences of 1 to {MAX_DRY_BREAKER_LEN} ids"
    breakers = [] if breakers is None else breakers
    if not isinstance(breakers, (list, tuple)):
        raise A.fail(op, "sequence_breakers", allowed, breakers)
    seqs = []
    for w in breakers:
        w = list(w) if isinstance(w, (list, tuple)) else [w]
        if not 1 <= len(w) <= MAX_DRY_BREAKER_LEN or not all(is_token(t, MAX_TOKEN_ID + 1) for t in w):
            raise A.fail(op, "sequence_breakers", allowed, w)
        seqs.append(w)
    single = sorted({w[0] for w in seqs if len(w) == 1})
    multi = [t for w in seqs if len(w) > 1 for t in w + [-1] * (MAX_DRY_BREAKER_LEN - len(w))]
    as_rows = lambda ids: torch.tensor(ids, dtype=torch.int64).reshape(1, -1).expand(rows, -1).to(dev)  # noqa: E731
    return as_rows(single), as_rows(multi)


def apply_bias(logits: torch.Tensor, token_ids: torch.Tensor, values: torch.Tensor, *,
               col_start: int = 0) -> torch.Tensor:
    """`l[token] += value` per row: token_ids [rows, K] int (-1 pad; distinct within a row),
    values [rows, K] float (in [-100, 100], the OpenAI range)."""
    op = "tpsample.ops.apply_bias"
    rows, _ = A.check_logits(op, logits)
    ids = _ids(op, "token_ids", token_ids, rows)
    ok = isinstance(values, torch.Tensor) and values.is_floating_point() and tuple(values.shape) == tuple(ids.shape)
    if not ok:
        got = values if not isinstance(values, torch.Tensor) else f"{values.dtype} {list(values.shape)}"
        raise A.fail(op, "values", f"a floating-point tensor of token_ids' shape {list(ids.shape)}", got)
    if values.device.type == "cpu" and not A.tracing() and bool((values.abs() > 100).any() | values.isnan().any()):
        raise A.fail(op, "values", "in [-100, 100]", values[(values.abs() > 100) | values.isnan()][:5].tolist())
    return torch.ops.tpsample.apply_bias(logits, ids, values, _col_start(op, col_start))


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, *, col_start: int = 0) -> torch.Tensor:
    """Tokens whose bit is 0 -> -inf: bitmask [rows, ceil(V/32)] int32, packed as xgrammar packs it
    (bit t % 32 of word t // 32 is token t; 1 = allowed)."""
    op = "tpsample.ops.apply_bitmask"
    rows, cols = A.check_logits(op, logits)
    start = _col_start(op, col_start)
    need = (start + cols + 31) // 32
    mask = A.check_ids(op, "bitmask", bitmask, rows, dims=2, dtype=torch.int32)
    if mask.shape[1] < need:
        raise A.fail(op, "bitmask", f"at least ceil((col_start + cols) / 32) = {need} words per row",
                     f"{mask.shape[1]} words")
    return torch.ops.tpsample.apply_bitmask(logits, mask, start)


def logprobs(logits: torch.Tensor, token_ids: torch.Tensor, top_n: int = 0, *, group=None,
             vocab_size: Optional[int] = None) -> LogprobsOutput:
    """The given tokens' logprobs and ranks (1 = most likely) and each row's top-n (value desc,
    ties -> lower id) from the log-softmax of the logits (NaN -> -inf), without a [rows, V]
    logprob tensor: token_ids [rows, 1 + n] (column 0 the given token), logprobs [rows, 1 + n]
    fp32 (-inf pads), ranks [rows]. The Sampler's raw logprobs, bit for bit, when logits and
    tokens are its own. Under TP (group of more than one rank) logits are this rank's shard,
    vocab_size is required, and the partial statistics are combined by collectives (eager)."""
    op = "tpsample.ops.logprobs"
    rows, cols = A.check_logits(op, logits)
    g = resolve_group(op, group)
    vocab = check_vocab(op, vocab_size, cols, g)
    tokens = A.check_ids(op, "token_ids", token_ids, rows, dims=1)
    if tokens.device.type == "cpu" and not A.tracing():
        bad = (tokens < 0) | (tokens >= vocab)
        if bool(bad.any()):
            raise A.fail(op, "token_ids", f"token ids in [0, {vocab})", tokens[bad][:5].tolist())
    n = A.check_int(op, "top_n", top_n, 0, 1 << 16)
    if g.size == 1:
        return LogprobsOutput(*torch.ops.tpsample.logprobs(logits, tokens, n, 0))
    start, _ = vocab_shard(vocab, g.size, g.rank)
    return LogprobsOutput(*logprobs_impl(logits, tokens, n, start, ShardReducer(Collectives(g))))
