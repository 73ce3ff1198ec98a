"""tpsample.LLM: the offline entry point of the engine.

    llm = tpsample.LLM("path/to/hf-folder", tensor_parallel_size=2, strategy="vocab_parallel")
    outs = llm.generate(["Hello"], tpsample.SamplingParams(temperature=0, max_tokens=32))
    outs = llm.chat([{"role": "user", "content": "Hello"}])     # the chat template applied

TP=1 runs in this process; TP>1 spawns one worker per rank (gloo on CPU, NCCL with one GPU per
rank), so build the LLM under `if __name__ == "__main__":`; under torchrun the ranks are the
torchrun processes. The engine sees token ids only: text, stop strings and DRY breaker strings
are the front end's (`engine.frontend`, `engine.breakers`). Engine options beyond the signature
pass through as keywords to `EngineConfig`. The folder is checked before any worker starts
(config.json, every tensor's name, dtype and shape from the safetensors headers, the tokenizer,
`max_model_len` against the checkpoint's context): a bad one is one ValueError line naming it.
"""
from __future__ import annotations

import os
import time
import uuid
import warnings
from collections.abc import Callable, Sequence

import torch

import tpsample
from tpsample.engine.backends import InProcessBackend, MultiprocBackend, SpmdBackend, under_torchrun
from tpsample.engine.breakers import with_token_breakers
from tpsample.engine.config import EngineConfig, NgramConfig, check_max_model_len
from tpsample.engine.core import NewRequest
from tpsample.engine.frontend import TrackedRequest, run_to_completion
from tpsample.engine.hf_files import load_tokenizer, read_generation_config
from tpsample.engine.prompts import chat_prompts, normalize_prompts
from tpsample.engine.request import EngineInfo, GuidedDecoding, RequestOutput, RunStats, StreamDelta
from tpsample.model import ModelConfig, check_checkpoint, resolve_dtype


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


def _check_model_arg(model) -> str:
    if model is None:
        raise ValueError("model must be a local HF checkpoint folder (config.json + *.safetensors), got None; "
                         "tpsample.engine.default_model.default_model() gives SmolLM2-135M-Instruct")
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError(f"model must be a folder path (str or os.PathLike), got {type(model).__name__}")
    return os.fspath(model)


class LLM:
    def __init__(self, model: str, *, tensor_parallel_size: int = 1, strategy: str = "auto",
                 device: str | None = None, dtype: str | torch.dtype | None = None,
                 gpu_memory_utilization: float = 0.9, max_num_seqs: int = 256,
                 max_model_len: int | None = None, speculative_ngram=None,
                 kv_cache_tokens: int | None = None, **engine_options):
        self._backend = None
        model = _check_model_arg(model)
        if isinstance(dtype, torch.dtype):
            dtype = str(dtype).removeprefix("torch.")
        self.config = EngineConfig(
            model=model, tensor_parallel_size=tensor_parallel_size, strategy=strategy, device=device,
            dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
            max_model_len=max_model_len, speculative_ngram=_ngram(speculative_ngram),
            kv_cache_tokens=kv_cache_tokens, **engine_options)
        # fail here, before any worker starts
        model_config = ModelConfig.from_folder(model)
        model_config.check_tensor_parallel(tensor_parallel_size)
        check_max_model_len(self.config.max_model_len, model_config)
        resolve_dtype(self.config.dtype, model_config)
        if self.config.load_format != "dummy":
            check_checkpoint(model, model_config)      # headers only: names, dtypes, full shapes
        read_generation_config(model)              # a malformed file is one line naming it, now
        self.tokenizer = load_tokenizer(model)
        if under_torchrun():
            self._backend = SpmdBackend(self.config)
        elif tensor_parallel_size == 1:
            self._backend = InProcessBackend(self.config)
        else:
            self._backend = MultiprocBackend(self.config)
        self.info: EngineInfo = self._backend.info
        self.last_stats: RunStats | None = None

    def generate(self, prompts, params=None, *,
                 guided: GuidedDecoding | Sequence[GuidedDecoding | None] | None = None,
                 stream: Callable[[StreamDelta], None] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. ValueError for a bad prompt, before any runs.

        prompts: a str, a list of str, a list of token-id lists, a token-id tensor ([T] or
        [B, T]) or a tokenizer's BatchEncoding (its attention mask drops padding).
        """
        texts, ids = normalize_prompts(prompts, self.tokenizer, self.config.model)
        return self._run(texts, ids, params, guided, stream)

    def chat(self, messages, params=None, *, guided=None, stream=None,
             chat_template: str | None = None) -> list[RequestOutput]:
        """Apply the tokenizer's chat template (with the generation prompt) and generate.

        messages: one conversation (a list of {"role", "content"} dicts) or a list of them.
        """
        texts, ids = chat_prompts(messages, self.tokenizer, chat_template)
        return self._run(texts, ids, params, guided, stream)

    def _run(self, texts, token_prompts, params, guided, stream) -> list[RequestOutput]:
        backend = self._live_backend()
        n = len(token_prompts)
        params = _per_prompt(params, n, "params", tpsample.SamplingParams)
        params = [with_token_breakers(p if p is not None else tpsample.SamplingParams(), self.tokenizer)
                  for p in params]
        guided = _per_prompt(guided, n, "guided", GuidedDecoding)
        if n == 0:
            return []
        prefix = uuid.uuid4().hex[:8]
        tracked = [TrackedRequest(f"{prefix}-{i}", i, ids, p, self.tokenizer, text)
                   for i, (ids, p, text) in enumerate(zip(token_prompts, params, texts))]
        if isinstance(backend, SpmdBackend) and backend.client() is None:
            outputs, self.last_stats = backend.follow_generate()
            return outputs
        new = tuple(NewRequest(t.req_id, t.prompt_token_ids, t.params, g, t.index) for t, g in zip(tracked, guided))
        start = time.perf_counter()
        try:
            outputs, stats = run_to_completion(backend.client(), tracked, new, stream)
        except ValueError as e:
            if isinstance(backend, SpmdBackend):
                backend.end_generate(error=e)
            raise
        stats.wall_s = time.perf_counter() - start
        if isinstance(backend, SpmdBackend):
            backend.end_generate(outputs=(outputs, stats))
        self.last_stats = stats
        _warn_nans(outputs)
        return outputs

    def engine_client(self):
        """The engine core's client (for front ends such as the server); see `engine.core`."""
        backend = self._live_backend()
        if isinstance(backend, SpmdBackend):
            raise ValueError("the engine client is not available under torchrun; use generate()")
        return backend.client()

    def _live_backend(self):
        if self._backend is None:
            raise ValueError("this LLM is closed; create a new tpsample.LLM")
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _warn_nans(outputs: list[RequestOutput]) -> None:
    bad = [o for o in outputs if o.num_nan_logits]
    if bad:
        ended = sum(o.finish_reason == "error" for o in bad)
        warnings.warn(f"{len(bad)} request(s) saw NaN logits ({sum(o.num_nan_logits for o in bad)} values); "
                      f"{ended} ended with finish_reason='error' because nothing finite was left to sample",
                      RuntimeWarning, stacklevel=3)
