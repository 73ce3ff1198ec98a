"""batch_sharded receives its requests' full rows straight into the buffer it samples (gloo, TP 2
and 3 with uneven vocabulary shards): one copy of the rows, in the logits' own dtype."""
from __future__ import annotations

import pytest
import torch

from tpsample import Sampler, SamplingParams
from tpsample.parallel.launch import spawn_ranks

V, ROWS = 100_003, 96          # V not divisible by 2 or 3: uneven shards


def _step(group, strategy: str, dtype: torch.dtype):
    s = Sampler(V, max_num_reqs=ROWS, strategy=strategy, seed=1, group=group)
    for i in range(ROWS):
        s.add_request(f"r{i}", SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=i), [1, 2, 3])
    plan = s.plan([f"r{i}" for i in range(ROWS)])
    x = torch.randn(ROWS, V, generator=torch.Generator().manual_seed(0)) * 3
    out = s.sample(x[plan.logits_order][:, s.col_start:s.col_end].to(dtype).contiguous(), plan)
    st = s.last_stats
    return [out.tokens(i) for i in range(ROWS)], st.peak_bytes, st.bytes_received, s.rank


@pytest.mark.parametrize("tp", [2, 3])
def test_batch_sharded_holds_one_copy_of_its_rows_in_their_dtype(tp):
    for dtype in (torch.float32, torch.bfloat16):
        want = _step(None, "replicated", dtype)[0]          # TP = 1
        own = ROWS // tp
        for tokens, peak, received, rank in spawn_ranks(_step, tp, "batch_sharded", dtype, timeout_s=300):
            assert tokens == want, f"tp={tp} {dtype} rank {rank}"
            size = torch.finfo(dtype).bits // 8
            rows_bytes = own * V * size
            # what crossed: the other ranks' columns of this rank's rows, in the logits' dtype
            # (then the step's small packed results)
            mine = V // tp + (rank < V % tp)
            assert own * (V - mine) * size <= received < own * (V - mine) * size + (64 << 10), (tp, dtype, rank)
            # held: the received rows once; the CPU count adds the torch pipeline's row chunks
            # (below one copy of the rows at this size) and, for bf16, its fp32 working copy
            if dtype == torch.float32:
                assert peak < 2 * rows_bytes, (tp, rank, peak, rows_bytes)
