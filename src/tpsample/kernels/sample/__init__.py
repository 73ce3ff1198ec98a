"""Entry points of the Triton kernels: exact, memory-lean sampling (`sample_rows`, launch.py),
logprob statistics (`kernels.stats`) and the vocab-parallel shard draw (`kernels.shard`),
re-exported here. The passes of `sample_rows` are the modules of this package (scan, select,
lists, bracket, rounds, finish; the launch sequence and the rows' stages in launch.py).

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
Never imports the sampling layers.
"""
from ..launcher import DEFAULT, KernelConfig, RowHints
from .launch import Kept, hints_from_params, sample_rows

__all__ = ["DEFAULT", "KernelConfig", "Kept", "RowHints", "hints_from_params", "logprob_stats", "sample_rows",
           "shard_gumbel_argmax", "token_logprob_stats"]


# The statistics and the shard draw import their kernel modules on first use (triton.jit picks
# interpreted or compiled when a kernel module is imported); the sampler calls `kernels.stats`.

def logprob_stats(x, **kwargs):
    """`kernels.stats.logprob_stats`."""
    from ..stats import logprob_stats as run
    return run(x, **kwargs)


def token_logprob_stats(x, values, n: int, **kwargs):
    """`kernels.stats.token_logprob_stats`."""
    from ..stats import token_logprob_stats as run
    return run(x, values, n, **kwargs)
def shard_gumbel_argmax(x, temperature, thr, key0, key1, *, col_offset: int = 0, cfg: KernelConfig = DEFAULT):
    """The vocab-parallel Gumbel partial of a rank's shard x [R, V_r] (column j is global id
    col_offset + j; l = fp32(x) / T, rows with T == 0 or temperature None: fp32(x); kept = l >=
    thr [R] and l > -inf): (value [R] fp32, global id [R] int64), the argmax over kept entries of
    fp32(l + g(key0, key1, global id)), ties -> lowest id; (-inf, col_offset) when nothing is
    kept (`kernels.shard.gumbel_draw`). Ranks combine by the largest value, ties -> lowest id."""
    from ..shard import gumbel_draw
    return gumbel_draw(x, thr, key0, key1, col_offset, temperature, cfg)
