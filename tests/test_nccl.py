"""NCCL, one rank per GPU: every strategy gives the tokens of a single GPU (TP=1) bitwise and its
logprobs to 1e-5. Needs two or more CUDA devices (gpu marker; scripts/gpu_tests.sh runs it)."""
from __future__ import annotations

import pytest
import torch

from tpsample.parallel.launch import spawn_ranks

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]

VARIANTS = ("mixed", "permuted", "waves", "draft_probs")


def _suite_on_own_gpu(group):
    """tp_suite with this rank's tensors on GPU `rank` (the scenarios read TPSAMPLE_TEST_DEVICE)."""
    import torch.distributed as dist
    torch.cuda.set_device(dist.get_rank(group))
    from scenarios import tp_suite
    return tp_suite(group)


def _close(a, b) -> bool:
    return a[0] == b[0] and a[2] == b[2] and all(abs(x - y) <= 1e-5 or x == y
                                                 for x, y in zip(a[1], b[1], strict=True))


def test_every_strategy_over_nccl_gives_single_gpu_tokens(monkeypatch):
    from scenarios import STRATEGIES
    monkeypatch.setenv("TPSAMPLE_TEST_DEVICE", "cuda")       # inherited by the spawned ranks
    one = spawn_ranks(_suite_on_own_gpu, 1, timeout_s=600)[0]
    tp = min(torch.cuda.device_count(), 4)
    ranks = spawn_ranks(_suite_on_own_gpu, tp, backend="nccl", timeout_s=600)
    for rank, res in enumerate(ranks):
        for s in STRATEGIES:
            assert res[(s, "one_request")] == one[("replicated", "one_request")], (rank, s)
            for v in VARIANTS:
                got, want = res[(s, v)], one[("replicated", v)]
                for step, (g, w) in enumerate(zip(got, want, strict=True)):
                    where = f"tp={tp} rank={rank} {s}/{v} step {step}"
                    assert g["tokens"] == w["tokens"] and g["rejected"] == w["rejected"], where
                    for req, lp in w.get("lp", {}).items():
                        assert _close(g["lp"][req], lp), where
        acc = {s: r[0] for s, r in res["accounting"].items()}
        assert acc["replicated"] == acc["batch_sharded"] == acc["vocab_parallel"]
