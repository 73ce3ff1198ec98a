"""ModelRunner: one per rank. Owns this rank's model shard, KV cache and sampler.

Contract
- Inputs: `StepInput`s (identical on every rank, in the same order). `execute` applies the
  sampler's removals and additions (so slots match on every rank), runs the forward over the
  step's tokens writing their K/V into the paged cache, computes this rank's local logits for
  the sampled rows in `plan.logits_order`, and calls the sampler.
- Outputs: the sampler's `SamplerOutput` (identical on every rank) or None when nothing sampled.
- Invariants: never all-gathers logits (what crosses ranks is the sampler strategy's business);
  every rank executes every step, including ranks that own no sampled row; the KV capacity is
  the same on every rank.
- Never imports the scheduler, tokenizers, xgrammar or any process-management code.
"""
from __future__ import annotations

import torch

import tpsample
from tpsample.engine.config import EngineConfig
from tpsample.engine.kv_cache import MemoryProfile, allocate_kv, size_kv
from tpsample.engine.step import StepInput
from tpsample.model import ModelConfig, TPGroup, build_attention_metadata, load_model, resolve_dtype


class ModelRunner:
    def __init__(self, cfg: EngineConfig, *, process_group=None, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.group = TPGroup(process_group)
        self.model_config = ModelConfig.from_folder(cfg.model)
        self.dtype = resolve_dtype(cfg.dtype, self.model_config)
        self.model = load_model(cfg.model, self.group, dtype=self.dtype, device=self.device)
        self.vocab_size = self.model_config.vocab_size
        eos = self.model_config.eos_token_ids
        self.sampler = tpsample.Sampler(
            self.vocab_size, max_num_reqs=cfg.max_num_seqs,
            max_num_logits_per_req=1 + cfg.num_speculative_tokens, strategy=cfg.strategy,
            group=process_group, device=self.device, max_logprobs=cfg.max_logprobs,
            eos_token_id=eos[0] if eos and eos[0] < self.vocab_size else None)
        wanted_len = cfg.max_model_len or self.model_config.max_position_embeddings
        self.memory: MemoryProfile = size_kv(self.model, self.sampler, cfg, self.group, self.dtype,
                                             self.device, wanted_len)
        capacity = self.memory.num_blocks * cfg.block_size
        if cfg.max_model_len is not None and cfg.max_model_len > capacity:
            raise ValueError(f"max_model_len={cfg.max_model_len} exceeds the KV cache capacity of "
                             f"{capacity} tokens; lower it or give the cache more memory")
        self.max_model_len = min(wanted_len, capacity)
        self.kv_cache = allocate_kv(self.model, self.memory.num_blocks, cfg.block_size, self.dtype, self.device)

    def sampler_peaks(self) -> list[int]:
        """Every rank's sampler peak from the profile step (a collective: call on every rank)."""
        peaks = torch.zeros(self.group.size, dtype=torch.int64, device=self.device)
        peaks[self.group.rank] = self.memory.sampler_peak_bytes
        return self.group.all_reduce(peaks).tolist()

    @torch.inference_mode()
    def execute(self, step: StepInput):
        for req_id in step.remove:
            self.sampler.remove_request(req_id)
        for req_id, params, prompt in step.add:
            self.sampler.add_request(req_id, params, prompt)
        if not step.token_ids:
            return None
        dev = self.device
        tokens = torch.tensor(step.token_ids, dtype=torch.int64, device=dev)
        positions = torch.cat([torch.arange(s - q, s) for q, s in zip(step.query_lens, step.seq_lens)]).to(dev)
        meta = build_attention_metadata(step.query_lens, step.seq_lens, step.block_tables,
                                        self.cfg.block_size, dev)
        hidden = self.model(tokens, positions, meta)                    # [T, H]
        if not step.sample_req_ids:
            return None
        plan = self.sampler.plan(step.sample_req_ids, draft_token_ids=step.draft_token_ids,
                                 grammar_bitmask=step.grammar_bitmask)
        rows = torch.tensor(step.logits_token_index, dtype=torch.int64)[plan.logits_order.cpu()]
        local_logits = self.model.compute_logits(hidden[rows.to(dev)])  # [rows, V_r]
        return self.sampler.sample(local_logits, plan)
