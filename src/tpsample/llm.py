"""tpsample.LLM: the offline entry point of the engine.

    llm = tpsample.LLM("path/to/hf-folder", tensor_parallel_size=2, strategy="vocab_parallel")
    outs = llm.generate(["Hello"], tpsample.SamplingParams(temperature=0, max_tokens=32))

TP=1 runs in this process; TP>1 spawns one worker per rank (gloo on CPU, NCCL with one GPU per
rank); under torchrun every rank runs the script and the ranks are the torchrun processes (see
`tpsample.engine.backends`). Structured output: `generate(..., guided=GuidedDecoding(...))`.
Streaming: `generate(..., stream=callback)`, called with a `StreamDelta` per request per step.
Spawned workers re-import the main module: build the LLM under `if __name__ == "__main__":`.
Engine options beyond the public signature (block_size, max_num_batched_tokens,
cpu_memory_bytes, step_timeout_s, ...) pass through as keywords to `EngineConfig`.
"""
from __future__ import annotations

import numbers
from typing import Callable, Sequence

import torch

import tpsample
from tpsample.engine.backends import InProcessBackend, SpmdBackend, under_torchrun
from tpsample.engine.config import EngineConfig, NgramConfig
from tpsample.engine.multiproc import MultiprocBackend
from tpsample.engine.report import EngineInfo, RunStats
from tpsample.engine.request import GuidedDecoding, RequestOutput, StreamDelta
from tpsample.engine.tokenizer import load_tokenizer
from tpsample.model import ModelConfig


def _ngram(spec) -> NgramConfig | None:
    if spec is None or isinstance(spec, NgramConfig):
        return spec
    if isinstance(spec, int) and not isinstance(spec, bool):
        return NgramConfig(num_speculative_tokens=spec)
    if isinstance(spec, dict):
        return NgramConfig(**spec)
    raise ValueError(f"speculative_ngram must be None, an int (draft tokens), a dict or an NgramConfig, got {spec!r}")


def _per_prompt(value, n: int, name: str, kind) -> list:
    if value is None or isinstance(value, kind):
        return [value] * n
    value = list(value)
    if len(value) != n or not all(v is None or isinstance(v, kind) for v in value):
        raise ValueError(f"{name} must be one {kind.__name__} or a list of {n} (one per prompt)")
    return value


class LLM:
    def __init__(self, model: str, *, tensor_parallel_size: int = 1, strategy: str = "auto",
                 device: str | None = None, dtype: str | torch.dtype | None = None,
                 gpu_memory_utilization: float = 0.9, max_num_seqs: int = 256,
                 max_model_len: int | None = None, speculative_ngram=None,
                 kv_cache_tokens: int | None = None, **engine_options):
        if isinstance(dtype, torch.dtype):
            dtype = str(dtype).removeprefix("torch.")
        self.config = EngineConfig(
            model=str(model), tensor_parallel_size=tensor_parallel_size, strategy=strategy, device=device,
            dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
            max_model_len=max_model_len, speculative_ngram=_ngram(speculative_ngram),
            kv_cache_tokens=kv_cache_tokens, **engine_options)
        ModelConfig.from_folder(self.config.model)   # fail here, before any worker starts
        self.tokenizer = load_tokenizer(self.config.model)
        self._backend = None
        if under_torchrun():
            self._backend = SpmdBackend(self.config)
        elif tensor_parallel_size == 1:
            self._backend = InProcessBackend(self.config)
        else:
            self._backend = MultiprocBackend(self.config)
        self.info: EngineInfo = self._backend.info
        self.last_stats: RunStats | None = None

    def generate(self, prompts: Sequence[str] | Sequence[Sequence[int]] | str, params=None, *,
                 guided: GuidedDecoding | Sequence[GuidedDecoding | None] | None = None,
                 stream: Callable[[StreamDelta], None] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. ValueError for a bad prompt, before any runs."""
        texts, token_prompts = self._encode([prompts] if isinstance(prompts, str) else list(prompts))
        n = len(token_prompts)
        params = _per_prompt(params, n, "params", tpsample.SamplingParams)
        params = [p if p is not None else tpsample.SamplingParams() for p in params]
        guided = _per_prompt(guided, n, "guided", GuidedDecoding)
        if n == 0:
            return []
        outputs, self.last_stats = self._backend.generate(token_prompts, params, guided, stream)
        for out, text in zip(outputs, texts):
            out.prompt = text
            if self.tokenizer is not None:
                out.text = self.tokenizer.decode(out.output_token_ids, skip_special_tokens=True)
        return outputs

    def _encode(self, prompts: list) -> tuple[list[str | None], list[list[int]]]:
        texts, ids = [], []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                if self.tokenizer is None:
                    raise ValueError(f"prompt {i} is text but {self.config.model} has no tokenizer; "
                                     "pass token ids")
                texts.append(p)
                ids.append(self.tokenizer.encode(p, add_special_tokens=True))
            elif isinstance(p, (list, tuple)) and all(isinstance(t, numbers.Integral) for t in p):
                texts.append(None)
                ids.append([int(t) for t in p])
            else:
                raise ValueError(f"prompt {i} must be a str or a list of token ids, got {type(p).__name__}")
        return texts, ids

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
