"""GPU kernels (Triton) for exact fused sampling, and what launches them.

- `sample`: the sampling pipeline by pass (scan, sigma, select, lists, bracket, rounds, finish,
  kept; the launch sequence and the rows' stages in `sample.launch`) and the entry points
  `sample_rows`, `logprob_stats`, `token_logprob_stats`, `shard_gumbel_argmax`;
- `stats`: the row statistics and logprob rows;
- `shard`, `shard_band`: vocab_parallel's passes over a rank's shard (the front's NaN counts,
  argmax and working copy, the summary's top values and tie counts, the shard draw; the top-p
  band's histogram and partials);
- `step_ops` (row parameters and keys, the front pass over the rows, the result block) and
  `history` (the history append and the penalties that read it): the per-step kernels;
- `tlutil`: device helpers and the noise's Triton twin;
- `launcher`: may a kernel run here, the launch shapes, batch hints and path counters, cheap
  launches, their recording and replay.
The engine's kernels (attention, model ops) live in `tpsample.model`. This package imports
nothing heavy at import time, so that CPU-only installs without Triton can still import
`tpsample`.
"""
