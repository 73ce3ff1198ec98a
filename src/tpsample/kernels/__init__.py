"""GPU kernels (Triton) for exact fused sampling, and their torch reference.

Entry points: `dispatch` (sampling and logprob statistics over per-row parameters),
`step_ops` (row parameters and keys, the result block, raw logprob rows), `history_ops` (the
history append), `penalties`, `row_prep` (NaN mask, grammar mask, the guard's best token),
`attention` (the engine's paged attention), `config` (launch shapes, availability, fallback
counts); `torch_ref` is the torch twin of the sampling kernels. This package imports nothing
heavy at import time so that CPU-only installs without Triton can still import `tpsample`.
"""
