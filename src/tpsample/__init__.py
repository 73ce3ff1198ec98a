"""tpsample: exact sampling for tensor-parallel LLM decoding."""
from .parallel.shard import vocab_shard
from .sampler import Sampler, StepStats
from .sampling.output import LogprobsOutput, SamplerOutput
from .sampling.params import SamplingParams

__all__ = ["Sampler", "SamplingParams", "SamplerOutput", "LogprobsOutput", "StepStats", "vocab_shard"]
__version__ = "0.1.0"
from .llm import LLM  # noqa: E402  (after the sampler: the engine builds on it)
from .engine.request import GuidedDecoding, RequestOutput  # noqa: E402

__all__ += ["LLM", "RequestOutput", "GuidedDecoding"]
