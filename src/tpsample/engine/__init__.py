"""A compact TP decode engine on top of the tpsample sampler (docs/engine.md)."""
from tpsample.engine.config import EngineConfig, NgramConfig
from tpsample.engine.request import (
    EngineInfo,
    GuidedDecoding,
    RequestOutput,
    RunStats,
    StreamDelta,
    TokenLogprob,
    TokenSupport,
)

__all__ = ["EngineConfig", "EngineInfo", "GuidedDecoding", "NgramConfig", "RequestOutput", "RunStats",
           "StreamDelta", "TokenLogprob", "TokenSupport"]
