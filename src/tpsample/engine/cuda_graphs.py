"""Decode steps replayed from CUDA graphs.

One graph per bucketed batch size (1, 2, 4, ..., max_num_seqs) holds the whole model forward and
the LM head (this rank's local logits) of a decode step: one new token per sequence. Inputs live
in persistent device buffers (token ids, positions, slot mapping, sequence lengths, block
tables), filled from pinned host twins with non-blocking copies; a batch pads up to its bucket
with rows of sequence length 0 and slot -1 (nothing written, output ignored). The sampler runs
outside the graph, on the returned logits. Graphs share one memory pool, captured largest first;
the logits of a replay are valid until the next replay.

Prefill and mixed steps, steps with drafts, and CPU runs take the eager path.
"""
from __future__ import annotations

import numpy as np
import torch

from tpsample.model import AttentionMetadata, CausalLM, PagedMetadata
from tpsample.model.kernels import num_decode_splits


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


class DecodeGraphs:
    def __init__(self, model: CausalLM, *, max_num_seqs: int, max_pages: int, page_size: int,
                 max_seq_len: int, device: torch.device):
        self.model, self.device = model, device
        self.page_size, self.max_seq_len = page_size, max_seq_len
        self.sizes = graph_batch_sizes(max_num_seqs)
        n = self.sizes[-1]
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.num_kv_heads = model.attention_layers()[0].num_kv_heads
        pinned = dict(pin_memory=True)
        self.host = dict(ids=torch.zeros(n, dtype=torch.int64, **pinned),
                         positions=torch.zeros(n, dtype=torch.int64, **pinned),
                         slots=torch.full((n,), -1, dtype=torch.int64, **pinned),
                         seq_lens=torch.zeros(n, dtype=torch.int32, **pinned),
                         tables=torch.zeros(n, max_pages, dtype=torch.int32, **pinned))
        self.dev = {k: v.to(device) for k, v in self.host.items()}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self._copied = torch.cuda.Event()
        self._copied.record()

    def _meta(self, bs: int) -> AttentionMetadata:
        d = self.dev
        paged = PagedMetadata(block_tables=d["tables"][:bs], seq_lens=d["seq_lens"][:bs], page_size=self.page_size,
                              max_seq_len=self.max_seq_len,
                              num_splits=num_decode_splits(bs, self.num_kv_heads, self.max_seq_len, self.num_sms))
        return AttentionMetadata(slot_mapping=d["slots"][:bs], seq_lens_per_token=d["seq_lens"][:bs], paged=paged)

    def _forward(self, bs: int) -> torch.Tensor:
        d = self.dev
        hidden = self.model(d["ids"][:bs], d["positions"][:bs], self._meta(bs))
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up (compiles the kernels) and capture every size, largest first, in one pool."""
        pool = None
        for bs in reversed(self.sizes):
            self._forward(bs)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[bs] = self._forward(bs)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)

    def bucket(self, num_seqs: int) -> int | None:
        return next((b for b in self.sizes if b >= num_seqs), None)

    def run(self, token_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, seq_lens: np.ndarray,
            tables: np.ndarray) -> torch.Tensor:
        """One decode step for n sequences -> local logits [n, V_r]; tables [n, pages in use]."""
        n, width = tables.shape
        bs = self.bucket(n)
        self._copied.synchronize()          # the last step's copies have left the pinned buffers
        h = self.host
        h["ids"][:n] = torch.from_numpy(token_ids)
        h["positions"][:n] = torch.from_numpy(positions)
        h["slots"][:n] = torch.from_numpy(slots)
        h["slots"][n:bs] = -1
        h["seq_lens"][:n] = torch.from_numpy(seq_lens.astype(np.int32, copy=False))
        h["seq_lens"][n:bs] = 0
        h["tables"][:n, :width] = torch.from_numpy(tables)
        for key in ("ids", "positions", "slots", "seq_lens"):
            self.dev[key][:bs].copy_(h[key][:bs], non_blocking=True)
        self.dev["tables"][:n, :width].copy_(h["tables"][:n, :width], non_blocking=True)
        self._copied.record()
        self.graphs[bs].replay()
        return self.logits[bs][:n]

    def close(self) -> None:
        self.graphs.clear()
        self.logits.clear()
        self.dev.clear()
        self.host.clear()
