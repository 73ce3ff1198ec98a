"""The KV-bound preset at small scale (TP=2, gloo): less sampler memory buys exactly the KV blocks
it frees, and those blocks let more requests run at once."""
from __future__ import annotations

from tpsample.bench.engine import PRESETS, run_preset


def test_kv_bound_preset_turns_freed_sampler_memory_into_kv_blocks_and_concurrency():
    preset = PRESETS["tiny-kv-bound"]
    summary = run_preset("tiny-kv-bound", strategies=["replicated", "vocab_parallel"], device="cpu",
                         hf_reference=False)
    rows = {r["strategy"]: r for r in summary["results"]}
    rep, vp = rows["replicated"], rows["vocab_parallel"]
    for r in (rep, vp):
        assert r["num_output_tokens"] == preset.num_requests * preset.max_tokens and r["tokens_per_s"] > 0
    block_bytes = rep["kv_bytes_per_token"] * rep["block_size"]
    freed = rep["sampler_peak_bytes"][0] - vp["sampler_peak_bytes"][0]
    assert freed > 0, "vocab_parallel must hold less sampling memory than replicated"
    assert abs((vp["kv_blocks"] - rep["kv_blocks"]) - freed // block_bytes) <= 1
    blocks_per_request = -(-(preset.prompt_len + preset.max_tokens) // rep["block_size"])
    assert rep["max_running"] == rep["kv_blocks"] // blocks_per_request < preset.num_requests
    assert vp["max_running"] == preset.num_requests
