"""The HTTP app: OpenAI's /v1/chat/completions, /v1/completions and /v1/models; vLLM's
/tokenize, /detokenize, /version, /metrics (Prometheus) and token-in / token-out
/inference/v1/generate; /health, and /stats (what the engine holds right now: KV blocks,
sampler slots, requests, and the choices finished so far by finish reason).

Every request passes `guard.Guard` first (Host, API key, content type, body size and time
limits). A route turns the body into token ids and SamplingParams off the event loop
(`inputs.Preparer`), runs it through the one engine loop (`AsyncEngine`), and shapes the result
(`openai_format`, answered by `streaming`). Sampling fields a request leaves out take
`defaults` (the model's generation config, see `sampling.generation_defaults`).
"""
from __future__ import annotations

import logging
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response

import tpsample
from tpsample.serve.async_engine import AsyncEngine, EngineStopped
from tpsample.serve.config import ServeConfig
from tpsample.serve.errors import install_error_handlers
from tpsample.serve.guard import Guard
from tpsample.serve.inputs import Preparer
from tpsample.serve.metrics import CONTENT_TYPE, ServeMetrics
from tpsample.serve.openai_format import Formatter, GenerateFormatter
from tpsample.serve.sampling import generation_defaults
from tpsample.serve.streaming import serve
from tpsample.serve.tokenize import detokenize, tokenize

log = logging.getLogger("tpsample.serve")


def build_app(llm, *, model_name: str, max_pending: int | None = None, config: ServeConfig | None = None,
              defaults: dict | None = None) -> FastAPI:
    """The app over `llm`; defaults: request defaults (None: the model's generation_config.json)."""
    config = config or ServeConfig()
    defaults = generation_defaults("auto", llm.config.model) if defaults is None else defaults
    engine = AsyncEngine(llm, max_pending=max_pending, grammar_timeout_s=config.grammar_timeout_s,
                         metrics=ServeMetrics(model_name))
    preparer = Preparer(engine.tokenizer, model_names=(model_name, llm.config.model),
                        max_model_len=llm.info.max_model_len, config=config, defaults=defaults)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="tpsample", lifespan=lifespan)
    app.state.engine, app.state.serve_config, app.state.defaults = engine, config, defaults
    app.add_middleware(Guard, config=config)
    install_error_handlers(app)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if engine.alive and not engine.draining else 503)

    @app.get("/stats")
    async def stats():
        report = await engine.report()
        return {"resources": report.resources, "finished": dict(engine.metrics.finished),
                "in_flight": engine.num_pending, "max_pending": engine.max_pending, "engine": llm.info.as_dict()}

    @app.get("/metrics")
    async def metrics():
        try:
            await engine.report()               # the gauges as they stand, the engine's counters
        except EngineStopped:
            pass
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/version")
    async def version():
        return {"version": tpsample.__version__}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(model_name, llm, created)]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        job = await preparer.prepare("chat", await request.body())
        return await serve(request, engine, job, Formatter("chat", model_name, engine.tokenizer, job))

    @app.post("/v1/completions")
    async def completions(request: Request):
        job = await preparer.prepare("completion", await request.body())
        return await serve(request, engine, job, Formatter("completion", model_name, engine.tokenizer, job))

    @app.post("/inference/v1/generate")
    async def generate(request: Request):
        job = await preparer.prepare("generate", await request.body())
        request_id = job.req.request_id or uuid.uuid4().hex
        return await serve(request, engine, job, GenerateFormatter(engine.tokenizer, job, request_id))

    @app.post("/tokenize")
    async def tokenize_route(request: Request):
        return await preparer.run(tokenize, preparer, await request.body())

    @app.post("/detokenize")
    async def detokenize_route(request: Request):
        return await preparer.run(detokenize, preparer, llm.info.vocab_size, await request.body())

    return app


def model_card(model_name: str, llm, created: int) -> dict:
    """vLLM's model card: `root` the checkpoint folder, `max_model_len` the served context."""
    return {"id": model_name, "object": "model", "created": created, "owned_by": "tpsample",
            "root": llm.config.model, "parent": None, "max_model_len": llm.info.max_model_len,
            "permission": [{"id": f"modelperm-{model_name}", "object": "model_permission", "created": created,
                            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}]}
