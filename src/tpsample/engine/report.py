"""What the engine reports: static facts fixed at start-up and statistics of a generate() run."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class EngineInfo:
    strategy: str
    tensor_parallel_size: int
    device: str
    dtype: str
    vocab_size: int
    num_kv_blocks: int
    block_size: int
    kv_tokens: int
    max_model_len: int
    max_num_seqs: int
    sampler_peak_bytes: tuple[int, ...]   # per rank, profile step at max_num_seqs x (1 + k) rows
    weights_bytes: int                    # per rank
    kv_bytes_per_token: int               # per rank
    attention: str = "torch"              # "triton" (paged kernels) or "torch" (gather + SDPA)
    cuda_graph_batch_sizes: tuple[int, ...] = ()   # decode batches replayed from CUDA graphs

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunStats:
    wall_s: float = 0.0
    num_steps: int = 0
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_preemptions: int = 0
    max_running: int = 0
    num_drafts: int = 0                   # requests that had draft tokens, summed over steps
    num_draft_tokens: int = 0
    num_accepted_drafts: int = 0
    num_decode_steps: int = 0             # steps with one new token per sequence
    decode_s: float = 0.0                 # their wall time, schedule to tokens on the host
    decode_context_tokens: int = 0        # sum over those steps of the sequences' context lengths

    def add_decode_step(self, seconds: float, context_tokens: int) -> None:
        self.num_decode_steps += 1
        self.decode_s += seconds
        self.decode_context_tokens += context_tokens

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def decode_bytes_per_s(self, weights_bytes: int, kv_bytes_per_token: int) -> float:
        """Bytes a decode step must read (weights once, each sequence's K/V) over its wall time."""
        if self.decode_s <= 0:
            return 0.0
        read = self.num_decode_steps * weights_bytes + self.decode_context_tokens * kv_bytes_per_token
        return read / self.decode_s

    def as_dict(self) -> dict:
        return {**asdict(self), "output_tokens_per_s": self.output_tokens_per_s}
