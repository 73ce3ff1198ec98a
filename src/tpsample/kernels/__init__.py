"""GPU kernels (Triton) for exact fused sampling, and their torch reference.

Entry points live in `tpsample.kernels.dispatch`; this package imports nothing heavy at import
time so that CPU-only installs without Triton can still import `tpsample`.
"""
