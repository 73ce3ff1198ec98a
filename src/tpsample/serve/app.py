"""The HTTP app: OpenAI's /v1/chat/completions, /v1/completions and /v1/models; vLLM's
/tokenize, /detokenize, /version, /metrics (Prometheus) and token-in / token-out
/inference/v1/generate; /health, and /stats (what the engine holds right now: KV blocks,
sampler slots, requests, and the choices finished so far by finish reason).

Every request passes `guard.Guard` first (Host, API key, content type, body size and time
limits). A route turns the body into token ids and SamplingParams off the event loop
(`inputs.Preparer`), runs it through the one engine loop (`AsyncEngine`), and answers (`serve`):
a JSON body, or server-sent events ending in `data: [DONE]`, shaped by a formatter
(`openai_format`: `response`, `opening`, `chunk`, `usage_chunk`). A client that disconnects,
streaming or not, cancels its request (the engine frees its slot and blocks at once); a failure
mid-stream is a last chunk holding an error body, then `data: [DONE]`. Sampling fields a request
leaves out take `defaults` (the model's generation config, see `sampling.generation_defaults`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

import tpsample
from tpsample.serve.async_engine import AsyncEngine, EngineStopped
from tpsample.serve.config import ServeConfig
from tpsample.serve.errors import error_body, install_error_handlers
from tpsample.serve.guard import Guard
from tpsample.serve.inputs import Prepared, Preparer, detokenize, tokenize
from tpsample.serve.metrics import CONTENT_TYPE, ServeMetrics
from tpsample.serve.openai_format import Formatter, GenerateFormatter
from tpsample.serve.sampling import generation_defaults

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


class EventStream(StreamingResponse):
    """SSE that notices a disconnect even while no token is due, and always closes its source."""

    def __init__(self, content, **kw):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}, **kw)

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream():
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass
                    tg.cancel_scope.cancel()
                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, allow_nan=False)}\n\n"


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _cancel_on_disconnect(request: Request, coro):
    """Run coro; if the client goes away first, cancel it (its requests are aborted)."""
    task, watch = asyncio.ensure_future(coro), asyncio.ensure_future(_until_disconnect(request))
    done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        watch.cancel()
        return task.result()
    task.cancel()
    return Response(status_code=499)


async def serve(request: Request, engine: AsyncEngine, job: Prepared, fmt):
    """Run one prepared request: a stream of events, or (cancelled by a disconnect) one JSON body."""
    gen = engine.generate(job.prompt_ids, job.params, job.guided, job.prompt_text, echo_only=job.echo_only,
                          skip_special_tokens=job.skip_special_tokens)
    if job.req.stream:
        try:
            await gen.__anext__()               # accepted: a rejected request is a 400, not a stream
        except BaseException:
            await gen.aclose()
            raise
        include_usage = bool(job.req.stream_options and job.req.stream_options.include_usage)
        return EventStream(_stream(gen, fmt, len(job.params), include_usage))
    return await _cancel_on_disconnect(request, _collect(gen, fmt))


async def _collect(gen, fmt):
    tracked = {}
    try:
        async for t, _ in gen:
            if t is not None:
                tracked[t.index] = t
    finally:
        await gen.aclose()
    return JSONResponse(fmt.response([tracked[i] for i in sorted(tracked)]))


async def _stream(gen, fmt, n: int, include_usage: bool):
    completion_tokens = 0
    try:
        for i in range(n):
            for chunk in fmt.opening(i):
                yield _sse(chunk)
        async for t, delta in gen:
            completion_tokens += len(delta.new_token_ids)
            chunk = fmt.chunk(t, delta)
            if chunk is not None:
                yield _sse(chunk)
        if include_usage:
            yield _sse(fmt.usage_chunk(completion_tokens))
        yield "data: [DONE]\n\n"
    except Exception as e:          # mid-stream failure: report it in the stream, then end it
        stopped = isinstance(e, EngineStopped)
        yield _sse(error_body(503 if stopped else 500, (str(e).splitlines() or [type(e).__name__])[0],
                              code="engine_stopped" if stopped else None))
        yield "data: [DONE]\n\n"
    finally:
        await gen.aclose()
