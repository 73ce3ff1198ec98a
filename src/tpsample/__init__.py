"""tpsample: exact sampling for tensor-parallel LLM decoding."""
from .parallel.shard import vocab_shard
from .sampler import Sampler, StepStats
from .sampling.output import LogprobsOutput, SamplerOutput
from .sampling.params import SamplingParams

__all__ = ["Sampler", "SamplingParams", "SamplerOutput", "LogprobsOutput", "StepStats", "vocab_shard"]
__version__ = "0.1.0"
