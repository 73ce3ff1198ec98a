"""`auto`: pick a strategy per step from measured costs (see docs/auto.md).

Estimated step time per rank (R rows, V vocab, TP ranks, V_r = ceil(V / TP), R_own the most
rows any rank owns under batch_sharded), from numbers measured on the real group and device
(`calibrate.py`) for the step's feature class:
- I_s: the whole step of strategy s (its collectives, glue and sampling) for one row of V'
  columns (V' = V on GPU, min(V, 32768) on CPU), so every fixed cost is in it;
- c_full, c_split: seconds per logit element of the two local paths (the full-row path with its
  kernels, which replicated and batch_sharded run; the round pipeline on a shard);
- link bandwidths of all-gather and all-to-all (bytes received per rank, reassembly included).
Then, with x+ = max(x, 0) and B = 4 (TP - 1) bytes per element received:
- replicated:     I + c_full (R V - V')+     + B (R V_r - V'_r)+ / bw_gather
- batch_sharded:  I + c_full (R_own V - V')+ + B (R_own V_r - V'_r)+ / bw_all_to_all
- vocab_parallel: I + c_split (R V_r - V'_r)+ + (R - 1) x words x B / 4 / bw_gather
Every rank agrees on the numbers through one collective, so every rank picks the same strategy.
Before the first measurement (the first step, whose logits reveal the device) constants per
device kind stand in. At TP = 1 every strategy is the same computation: `replicated`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..numerics import next_pow2

ORDER = ("vocab_parallel", "batch_sharded", "replicated")      # least memory first (ties)


@dataclass(frozen=True)
class Features:
    """What a step's rows use, bucketed so that a few classes cover every batch."""
    sample: bool          # some row samples (else greedy only)
    k_max: int            # largest top-k, rounded up to a power of two (0: none)
    top_p: bool           # some sampled row uses top-p without top-k
    top_p_k: bool         # some row uses top-p with top-k
    min_p: bool
    logprobs: int         # largest top-n + 1, rounded up to a power of two (0: none)
    processed: bool       # some row wants processed logprobs
    drafts: bool          # the step verifies draft tokens

    @staticmethod
    def of(temperature, top_k, top_p, min_p, num_logprobs, processed, drafts: bool) -> "Features":
        """From per-request host arrays (numpy)."""
        s = temperature > 0
        k = int(top_k[s].max()) if s.any() else 0
        lp = int(num_logprobs.max()) + 1 if len(num_logprobs) and num_logprobs.max() >= 0 else 0
        return Features(bool(s.any()), next_pow2(k) if k > 0 else 0, bool((s & (top_p < 1) & (top_k <= 0)).any()),
                        bool((s & (top_p < 1) & (top_k > 0)).any()), bool((s & (min_p > 0)).any()),
                        next_pow2(lp) if lp > 0 else 0, bool(((num_logprobs >= 0) & (processed != 0)).any()), drafts)


@dataclass(frozen=True)
class CommCosts:
    latency_s: float          # one small collective
    gather_Bps: float         # bytes received per second per rank, all-gather (+ reassembly)
    all_to_all_Bps: float     # the same for all-to-all


@dataclass(frozen=True)
class StepCosts:
    """Measured for one feature class (see the module docstring)."""
    small_vocab: int                           # V' of the intercepts
    intercept: tuple[float, float, float]      # seconds: replicated, batch_sharded, vocab_parallel
    full_per_elem: float
    split_per_elem: float


def vp_rounds(f: Features) -> int:
    """Collectives of one vocab-parallel step (sampling/rounds/rounds.py)."""
    if f.drafts:                  # the general pipeline: a few reductions per spec-decode term
        return 8 + (2 if f.logprobs else 0)
    summary = f.sample and (f.k_max > 0 or f.min_p or f.top_p)
    return 1 + int(summary) + int(f.logprobs > 0)


def vp_words(f: Features) -> int:
    """int32 words one rank sends per row over a vocab-parallel step (an upper estimate)."""
    words = 7 + (3 if f.logprobs else 0)
    if f.sample and (f.k_max > 0 or f.min_p or f.top_p):
        words += (f.k_max + 1 if f.k_max else 1) + 1
    if f.top_p:
        words += 130 + 4 + 6 * 32
    if f.logprobs:
        words += 6 + 2 * f.logprobs
    return words


def estimates(rows: int, owner_rows: int, vocab: int, tp: int, f: Features, comm: CommCosts,
              m: StepCosts) -> dict[str, float]:
    """Seconds per step for each strategy."""
    width, small = math.ceil(vocab / tp), m.small_vocab
    small_width = math.ceil(small / tp)
    per_elem = 4 * (tp - 1)
    i_rep, i_bs, i_vp = m.intercept
    return {
        "replicated": i_rep + m.full_per_elem * max(rows * vocab - small, 0)
        + per_elem * max(rows * width - small_width, 0) / comm.gather_Bps,
        "batch_sharded": i_bs + m.full_per_elem * max(owner_rows * vocab - small, 0)
        + per_elem * max(owner_rows * width - small_width, 0) / comm.all_to_all_Bps,
        "vocab_parallel": i_vp + m.split_per_elem * max(rows * width - small_width, 0)
        + max(rows - 1, 0) * vp_words(f) * per_elem / comm.gather_Bps,
    }


def choose(rows: int, owner_rows: int, vocab: int, tp: int, f: Features, comm: CommCosts,
           m: StepCosts) -> str:
    """The strategy with the lowest estimated time (ties -> the less memory-hungry one)."""
    if tp == 1:
        return "replicated"
    est = estimates(rows, owner_rows, vocab, tp, f, comm, m)
    return min(ORDER, key=lambda s: est[s])


def static_costs(device_type: str, f: Features) -> tuple[CommCosts, StepCosts]:
    """Stand-in constants before anything is measured (one gloo CPU / NCCL GPU guess each)."""
    if device_type == "cuda":
        comm, glue, per_elem = CommCosts(25e-6, 150e9, 150e9), 3e-4, 2.5e-12
    else:
        comm, glue, per_elem = CommCosts(300e-6, 5e8, 5e8), 5e-3, 7e-9
    lat = comm.latency_s
    intercept = (glue + lat, glue + (2 + (f.logprobs > 0)) * lat, glue + vp_rounds(f) * lat)
    return comm, StepCosts(1, intercept, per_elem, per_elem)


def as_array(comm: CommCosts, m: StepCosts) -> np.ndarray:
    """Costs as numbers to average over ranks (bandwidths inverted: seconds per byte)."""
    return np.array([comm.latency_s, 1 / comm.gather_Bps, 1 / comm.all_to_all_Bps, m.small_vocab,
                     *m.intercept, m.full_per_elem, m.split_per_elem], dtype=np.float64)


def from_array(v) -> tuple[CommCosts, StepCosts]:
    v = [float(x) for x in v]
    return CommCosts(v[0], 1 / v[1], 1 / v[2]), StepCosts(int(v[3]), (v[4], v[5], v[6]), v[7], v[8])
