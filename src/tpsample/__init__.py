"""tpsample: exact sampling for tensor-parallel LLM decoding.

`import tpsample` loads the sampler only. The engine (`LLM`, `RequestOutput`, `GuidedDecoding`)
and its dependencies (safetensors, transformers, xgrammar) load on first use of those names, and
the stateless ops (`tpsample.ops`, which register torch.library ops) on first use of `ops`.
"""
from __future__ import annotations

import importlib

from .parallel.plan import SamplingPlan
from .parallel.shard import vocab_shard
from .params import SamplingParams
from .replay import CapturedStep
from .sampler import Sampler, StepStats
from .sampling.output import KeptSupport, LogprobsOutput, SamplerOutput

__version__ = "0.1.0"

_LAZY = {   # name -> module that defines it (imported on first access)
    "LLM": "tpsample.llm",
    "RequestOutput": "tpsample.engine.request",
    "GuidedDecoding": "tpsample.engine.request",
    "ops": "tpsample.ops",                 # a module: the name is the module itself
}

__all__ = ["Sampler", "SamplingParams", "SamplerOutput", "LogprobsOutput", "KeptSupport", "StepStats", "SamplingPlan",
           "CapturedStep", "vocab_shard", "LLM", "RequestOutput", "GuidedDecoding", "ops"]


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        value = module if module.__name__ == f"{__name__}.{name}" else getattr(module, name)
        globals()[name] = value            # later lookups skip this hook
        return value
    raise AttributeError(f"module 'tpsample' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
