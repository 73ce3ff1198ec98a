"""Entry points of the Triton kernels: exact, memory-lean sampling, logprob statistics and the
vocab-parallel shard draw. The passes of `sample_rows` are the modules of this package (scan,
select, hist, lists, bracket, rounds, finish; their per-row state in state.py, the launch
sequence in launch.py); the statistics and the shard draw are `kernels.stats`.

Contract (docs/semantics.md steps 6-10 and 12 on processed rows; the torch twin the tests hold
the kernels to is tests/kernels_torch_ref.py, and `tpsample.sampling` computes the same on CPU):
- x: [R, V_local] fp32 / bf16 / fp16 logits, unit column stride, any row stride; never copied
  or upcast as a whole (kernels upcast per block). Column j is global token col_offset + j.
- Per-row params: temperature [R] fp32 (0 = greedy), top_k [R] int32 (<= 0 or >= V: off),
  top_p [R] fp32 (>= 1: off), log_min_p [R] fp32 (= log(min_p); -inf: off), key0/key1 [R] int64
  holding uint32 row keys from `tpsample.noise.row_keys`.
- l = fp32(x) / T with IEEE division; NaN counts as -inf everywhere; -inf is never kept.
  greedy: argmax of fp32(x), ties -> lowest id; valid iff that max > -inf.
  t1 = max(l) + log_min_p (only when min-p is on), and at least top-n-sigma's M - n x sigma
  when n_sigma [R] fp32 is given and the row's n > 0 (M, sigma: tpsample.sampling.top_n_sigma's
  fixed-point statistics of the finite l, the same threshold bit for bit); t2 = the k-th largest l counting duplicates
  (-inf if fewer than k entries); thr = max(t1, t2); kept = l >= thr and l > -inf.
  top-p (when on and max(l) is finite): m = max(l), e_i = trunc(exp(l_i - m) * 2**shift) int64
  (exp(0) = 1), shift = 62 - max(1, ceil(log2(V_global))); S = sum of e over kept;
  v* = the smallest kept value with float64(sum of e over kept l_j > v*) < float64(top_p) * S;
  kept = l >= v*. draw: argmax over kept of fp32(l + g(key0, key1, global id)), ties -> lowest id.
  guard: no kept entry -> the argmax of fp32(x) (0 if all are -inf/NaN), valid = False.
- Keys: order_key(f) = bits ^ 0x80000000 (sign clear) or ~bits (sign set), with -0.0 keyed as
  +0.0 so that key order is exactly value order.
- Extra memory: O(R x (V / 128 + 2048)) bytes-scale workspace, about 10 MiB at R = 256,
  V = 151936; no [R, V] temporary, no fp32 copy.
- Exactness: every decision is on exact integers or keys. Bits match torch wherever exp / log
  do: on CUDA, `log` is libdevice's (as torch's); `exp` is libdevice's when exact_exp (default)
  and `ex2.approx` otherwise. Under TRITON_INTERPRET=1, numpy's exp / log may differ from
  torch's CPU ones in the last ulp (a token differs only if that ulp decides it).
Must not import tpsample.sampling's pipeline (only rng); the sampler imports this module.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ...numerics import mass_shift
from ..config import DEFAULT, KernelConfig, RowHints, row_hints
from ..gate import interpreting

__all__ = ["DEFAULT", "KernelConfig", "Kept", "RowHints", "hints_from_params", "logprob_stats", "sample_rows",
           "shard_gumbel_argmax", "token_logprob_stats"]


def hints_from_params(temperature, top_k, top_p, log_min_p, vocab_size: int, n_sigma=None) -> RowHints:
    """RowHints from the per-row parameter tensors (one device sync if they live on the GPU);
    a top-n-sigma row filters as a min-p row does."""
    thresholded = log_min_p > float("-inf")
    if n_sigma is not None:
        thresholded = thresholded | (n_sigma > 0)
    return row_hints(temperature, top_k, top_p, thresholded, vocab_size)


@dataclass(frozen=True)
class Kept:
    """What `sample_rows`'s kept pass reads (kept.py): rows, [n] int64 on x's device, the rows it
    reads (each once); with XTC, xtc_threshold [R] fp32 and coin [R] bool (the row's seeded coin
    came up), else None."""
    rows: torch.Tensor
    xtc_threshold: torch.Tensor | None = None
    coin: torch.Tensor | None = None


@functools.cache
def _launch_sample():
    """`launch.launch_sample`, imported on first use (the kernels are built then,
    interpreted or for the GPU) and kept, so a call runs no import statement."""
    from .launch import launch_sample
    return launch_sample


@functools.cache
def _interpreting_on_cuda() -> bool:
    """TRITON_INTERPRET on a CUDA machine, read once: it is fixed when the process starts there
    (the tests set it per module only on machines without CUDA)."""
    return interpreting()


def sample_rows(x, temperature, top_k, top_p, log_min_p, key0, key1, *, col_offset: int = 0,
                vocab_size_global: int | None = None, hints: RowHints | None = None,
                exact_exp: bool | None = None, cfg: KernelConfig = DEFAULT, nans_out=None, out=None, n_sigma=None,
                kept=None):
    """Sample one token per row (semantics above). Returns (token_ids [R] int64 global ids,
    valid [R] bool: False where the guard chose the token). nans_out="partials": also return the
    [R, splits] int32 per-split NaN counts (sum them per row). nans_out: optional [R] int64 tensor
    that receives each row's NaN count (counted in the first pass, no extra read of x).
    out: optional (token_ids [R] int64, valid [R] bool) written instead of new tensors (the
    per-row parameters must then already be contiguous, on x's device, in the dtypes above).
    n_sigma: optional [R] top-n-sigma (<= 0: off); None, the batch has none: the kernels then
    compile and launch nothing for it. kept: optional `launch.Kept` (rows whose kept set to
    measure, and XTC's threshold and coins): one more pass over those rows, whose XTC rows are
    redrawn under XTC's upper bound; the result then ends with (count, smallest, largest, upper)
    [R] of their kept values (kept.py)."""
    rows, cols = x.shape
    if rows == 0:      # a rank that owns no rows this step (batch_sharded) still returns the same shapes
        empty = (torch.zeros(0, dtype=torch.int64, device=x.device), torch.zeros(0, dtype=torch.bool, device=x.device))
        return (*empty, torch.zeros(0, 1, dtype=torch.int32, device=x.device)) if isinstance(nans_out, str) else empty
    if x.stride(1) != 1:
        raise ValueError("x must have unit column stride")
    dev = x.device
    if out is not None:      # the caller's own buffers: its parameters are in place already
        params = (temperature, top_k, top_p, log_min_p, key0, key1)
    else:
        params = tuple(v.to(dev, dt).contiguous() for v, dt in (
            (temperature, torch.float32), (top_k, torch.int32), (top_p, torch.float32), (log_min_p, torch.float32),
            (key0, torch.int64), (key1, torch.int64)))
    if n_sigma is not None and out is None:
        n_sigma = n_sigma.to(dev, torch.float32).contiguous()
    if hints is None:
        hints = hints_from_params(params[0], params[1], params[2], params[3], cols, n_sigma)
    if exact_exp is None:
        exact_exp = dev.type == "cuda" and not _interpreting_on_cuda()
    shift = mass_shift(vocab_size_global or cols)
    return _launch_sample()(x, params, col_offset, shift, hints, exact_exp, cfg, nans_out, out, n_sigma, kept)


def logprob_stats(x, *, temperature=None, threshold=None, n: int = 0, col_offset: int = 0,
                  cfg: KernelConfig = DEFAULT):
    """Per-row (max [R] fp32, lse [R] fp32, top_vals [R, n] fp32, top_ids [R, n] int64 global)
    of the transform l = fp32(x) (/ T for rows with T != 0 when `temperature` is given; entries
    < `threshold` [R] -> -inf when given, the processed kept-set row; NaN -> -inf).
    lse sums exp(l - max) in fp32 per block and fp64 across (error ~1e-6); +-inf max -> lse = max.
    top-n: value desc, ties -> lower id; (-inf, -1) pads rows shorter than n."""
    from ..stats import launch_stats
    mx, _, lse, tv, ti, _ = launch_stats(x, temperature, threshold, None, n, True, col_offset, cfg)
    return mx, lse, tv, ti


def token_logprob_stats(x, values, n: int, *, col_offset: int = 0, cfg: KernelConfig = DEFAULT, tokens=None,
                        temperature=None):
    """One pass over l = fp32(x) (NaN -> -inf; / T for rows with T != 0 when `temperature` [R] is
    given) for the logprobs of sampled tokens whose values [R] fp32 are `values` (or, with
    `tokens` [R] int64 global ids instead, the values of l at those ids): (lse [R] fp32, top_vals
    [R, n], top_ids [R, n] global ids, count [R] int64 of entries strictly greater than values,
    i.e. rank - 1)."""
    from ..stats import launch_stats
    _, _, lse, tv, ti, cnt = launch_stats(x, temperature, None, values, n, True, col_offset, cfg, tokens=tokens)
    return lse, tv, ti, cnt


# The vocab-parallel Gumbel partial: x is this rank's shard [R, V_r] whose column j is global id
# col_offset + j; l = fp32(x) / T (rows with T == 0, or temperature None: fp32(x)); kept = l >= thr
# and l > -inf (thr [R] fp32, -inf for none).

def shard_gumbel_argmax(x, temperature, thr, key0, key1, *, col_offset: int = 0, cfg: KernelConfig = DEFAULT):
    """(value [R] fp32, global id [R] int64): argmax over kept local entries of fp32(l + g(key0,
    key1, global id)), ties -> lowest id; (-inf, col_offset) when nothing is kept. Ranks combine
    by the largest value, ties -> lowest global id."""
    from ..shard import gumbel_draw
    return gumbel_draw(x, thr, key0, key1, col_offset, temperature, cfg)
