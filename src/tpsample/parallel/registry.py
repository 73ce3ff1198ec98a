"""The strategy objects by name: `STRATEGIES["vocab_parallel"].sample(local_logits, plan, ctx)`.

Stateless singletons (per-step state lives in the plan and the step context), shared by the
`Sampler` and its CUDA-graph capture.
"""
from __future__ import annotations

from .batch_sharded import BatchSharded
from .replicated import Replicated
from .vocab_parallel import VocabParallel

STRATEGIES = {s.name: s for s in (Replicated(), BatchSharded(), VocabParallel())}
