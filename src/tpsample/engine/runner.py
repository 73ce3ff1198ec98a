"""ModelRunner: one per rank. Owns this rank's model shard, KV cache, block tables and sampler.

Contract
- Inputs: `StepInput`s (identical on every rank, in the same order). `execute` applies the
  sampler's removals and additions (so slots match on every rank) and the step's block-table
  diff, runs the forward over the step's tokens writing their K/V into the paged cache, computes
  this rank's local logits for the sampled rows in `plan.logits_order`, and calls the sampler.
- Outputs: a `StepOutput` (identical on every rank): the sampler's `SamplerOutput` (None when
  nothing sampled) and the logprobs of the step's prompt-logprob rows (prefill positions of
  requests that asked for prompt logprobs), computed from this rank's vocab shard of those rows
  with `tpsample.ops.logprobs` (log-sum-exp and top-n across ranks by collectives: no rank
  gathers a full row), at most `prompt_logprob_chunk` rows at a time.
- Paths: on CUDA the attention is the Triton paged kernels and pure decode steps replay a CUDA
  graph (`DecodeGraphs`: forward + LM head; the sampler runs outside it); prefill, mixed and
  draft steps run eagerly. On CPU: the torch attention, eagerly. Metadata is built with numpy,
  never per token.
- Invariants: never all-gathers logits (what crosses ranks is the sampler strategy's business);
  every rank executes every step, including ranks that own no sampled row; the KV capacity is
  the same on every rank. `close` drops every device tensor the runner holds.
- Never imports the scheduler, tokenizers, xgrammar or any process-management code.
"""
from __future__ import annotations

import numpy as np
import torch

import tpsample
from tpsample.kernels.launcher import kernels_wanted
from tpsample.numerics import release_device_memory
from tpsample.engine.blocks import BlockTables
from tpsample.engine.config import EngineConfig
from tpsample.engine.kv_cache import MemoryProfile, allocate_kv, size_kv
from tpsample.engine.step import StepInput, StepOutput
from tpsample.model import (
    AttentionMetadata,
    CausalLM,
    ModelConfig,
    TPGroup,
    build_attention_metadata,
    build_paged_metadata,
    PagedMetadata,
    load_model,
    resolve_dtype,
    slot_mapping_np,
)


def kernels_usable(device: torch.device) -> bool:
    """The engine's kernels (attention, model ops): CUDA with Triton only."""
    return kernels_wanted(device, cpu_ok=False)


class ModelRunner:
    def __init__(self, cfg: EngineConfig, *, process_group=None, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.group = TPGroup.of(process_group)
        self.model_config = ModelConfig.from_folder(cfg.model)
        self.dtype = resolve_dtype(cfg.dtype, self.model_config)
        self.model = load_model(cfg.model, self.group, dtype=self.dtype, device=self.device,
                                load_format=cfg.load_format)
        self.vocab_size = self.model_config.vocab_size
        self.use_kernels = kernels_usable(self.device)
        self.attention_backend = "triton" if self.use_kernels else "torch"
        eos = self.model_config.eos_token_ids
        self.sampler = tpsample.Sampler(
            self.vocab_size, max_num_reqs=cfg.max_num_seqs,
            max_num_logits_per_req=1 + cfg.num_speculative_tokens, strategy=cfg.strategy,
            group=process_group, device=self.device, max_logprobs=cfg.max_logprobs,
            eos_token_id=eos[0] if eos and eos[0] < self.vocab_size else None,
            auto_graph=False)      # the decode graph's device time hides the eager sampler's host work
        wanted_len = cfg.max_model_len or self.model_config.max_position_embeddings
        self.memory: MemoryProfile = size_kv(self.model, self.sampler, cfg, self.group, self.dtype,
                                             self.device, wanted_len, use_kernels=self.use_kernels)
        capacity = self.memory.num_blocks * cfg.block_size
        if cfg.max_model_len is not None and cfg.max_model_len > capacity:
            raise ValueError(f"max_model_len={cfg.max_model_len} exceeds the KV cache capacity of "
                             f"{capacity} tokens; lower it or give the cache more memory")
        self.max_model_len = min(wanted_len, capacity)
        self.kv_cache = allocate_kv(self.model, self.memory.num_blocks, cfg.block_size, self.dtype, self.device)
        self.max_seq_len = self.max_model_len + cfg.num_speculative_tokens
        max_pages = -(-self.max_seq_len // cfg.block_size)
        self.tables = BlockTables(cfg.max_num_seqs, max_pages)
        self.graphs = None
        if self.use_kernels and cfg.cuda_graphs and self._graphs_supported():
            self.graphs = DecodeGraphs(self.model, max_num_seqs=cfg.max_num_seqs, max_pages=max_pages,
                                       page_size=cfg.block_size, max_seq_len=self.max_seq_len, device=self.device)
            self.graphs.capture()
        self.cuda_graph_batch_sizes = tuple(self.graphs.sizes) if self.graphs else ()
        # prompt-logprob rows at a time: no more logits rows than a step's sampler already holds
        self.prompt_logprob_chunk = min(64, cfg.max_num_seqs * (1 + cfg.num_speculative_tokens))

    def _graphs_supported(self) -> bool:
        # dynamic NTK RoPE computes angles from each sequence's length on the host side of torch ops
        return self.model_config.rope.rope_type != "dynamic"

    def sampler_peaks(self) -> list[int]:
        """Every rank's sampler peak from the profile step (a collective: call on every rank)."""
        peaks = torch.zeros(self.group.size, dtype=torch.int64, device=self.device)
        peaks[self.group.rank] = self.memory.sampler_peak_bytes
        return self.group.all_reduce(peaks).tolist()

    @torch.inference_mode()
    def execute(self, step: StepInput) -> StepOutput:
        for req_id in step.remove:
            self.sampler.remove_request(req_id)
            self.tables.remove(req_id)
        for req_id, params, prompt in step.add:
            self.sampler.add_request(req_id, params, prompt)
            self.tables.add(req_id)
        self.tables.apply(step.block_updates)
        if not step.token_ids:
            return StepOutput()
        q_lens = np.asarray(step.query_lens, dtype=np.int64)
        s_lens = np.asarray(step.seq_lens, dtype=np.int64)
        rows = self.tables.rows(step.seq_req_ids)
        tables = self.tables.gather(rows, int(-(-s_lens.max() // self.cfg.block_size)))
        positions, slots = slot_mapping_np(q_lens, s_lens, tables, self.cfg.block_size)
        token_ids = np.asarray(step.token_ids, dtype=np.int64)
        decode = len(token_ids) == len(s_lens) == len(step.logits_token_index)
        if decode and self.graphs is not None and self.graphs.bucket(len(s_lens)) is not None:
            plan = self._plan(step)
            logits = self.graphs.run(token_ids, positions, slots, s_lens, tables)    # [S, V_r], row = seq
            return StepOutput(self.sampler.sample(_reorder(logits, plan.logits_order), plan))
        meta = self._metadata(q_lens, s_lens, tables, slots, decode)
        dev = self.device
        hidden = self.model(torch.from_numpy(token_ids).to(dev), torch.from_numpy(positions).to(dev), meta)
        prompt_logprobs = self._prompt_logprobs(hidden, step) if step.prompt_logprob_index else None
        if not step.sample_req_ids:
            return StepOutput(None, prompt_logprobs)
        plan = self._plan(step)
        rows = torch.tensor(step.logits_token_index, dtype=torch.int64)[plan.logits_order.cpu()]
        local_logits = self.model.compute_logits(hidden[rows.to(dev)])  # [rows, V_r]
        return StepOutput(self.sampler.sample(local_logits, plan), prompt_logprobs)

    def _prompt_logprobs(self, hidden: torch.Tensor, step: StepInput):
        """The given prompt tokens' logprobs, ranks and top-n over this rank's shard (a collective)."""
        rows = torch.tensor(step.prompt_logprob_index, dtype=torch.int64, device=self.device)
        targets = torch.tensor(step.prompt_logprob_token_ids, dtype=torch.int64, device=self.device)
        parts = []
        for start in range(0, len(rows), self.prompt_logprob_chunk):
            end = start + self.prompt_logprob_chunk
            local_logits = self.model.compute_logits(hidden[rows[start:end]])     # [chunk, V_r]
            parts.append(tpsample.ops.logprobs(local_logits, targets[start:end], step.num_prompt_logprobs,
                                               group=self.group, vocab_size=self.vocab_size))
        return tpsample.ops.LogprobsOutput(torch.cat([p.token_ids for p in parts]),
                                           torch.cat([p.logprobs for p in parts]), torch.cat([p.ranks for p in parts]))

    def _plan(self, step: StepInput):
        return self.sampler.plan(step.sample_req_ids, draft_token_ids=step.draft_token_ids,
                                 grammar_bitmask=step.grammar_bitmask)

    def _metadata(self, q_lens: np.ndarray, s_lens: np.ndarray, tables: np.ndarray, slots: np.ndarray,
                  decode: bool) -> AttentionMetadata:
        if not self.use_kernels:
            return build_attention_metadata(q_lens, s_lens, tables, self.cfg.block_size, self.device)
        num_kv_heads = self.model.attention_layers()[0].num_kv_heads
        return build_paged_metadata(q_lens, s_lens, tables, slots, self.cfg.block_size, self.max_seq_len,
                                    self.device, decode=decode, num_kv_heads=num_kv_heads)

    def close(self) -> None:
        """Release the model, KV cache, graphs and sampler (and their device memory)."""
        if self.graphs is not None:
            self.graphs.close()
        for attn in (self.model.attention_layers() if self.model is not None else []):
            attn.kv_cache = None
        self.graphs = self.kv_cache = self.model = self.sampler = None
        release_device_memory()


def _reorder(logits: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """logits[order], skipping the gather when the order is the identity."""
    idx = order.cpu().numpy()
    if np.array_equal(idx, np.arange(len(idx))):
        return logits
    return logits[order.to(logits.device)]


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


class DecodeGraphs:
    """Decode steps (one new token per sequence, no drafts) replayed from CUDA graphs.

    One graph per bucketed batch size (1, 2, 4, ..., max_num_seqs) holds the whole model forward
    and the LM head. Inputs live in persistent device buffers filled from pinned host twins with
    non-blocking copies; a batch pads up to its bucket with rows of sequence length 0 and slot -1
    (nothing written, output ignored). Graphs share one memory pool, captured largest first; the
    logits of a replay are valid until the next replay.
    """
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
        from tpsample.model.kernels import num_decode_splits

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
