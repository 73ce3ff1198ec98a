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
    num_draft_tokens: int = 0
    num_accepted_drafts: int = 0

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "output_tokens_per_s": self.output_tokens_per_s}
