"""The OpenAI-compatible HTTP app: /v1/chat/completions, /v1/completions, /v1/models, /health,
and /stats (what the engine holds right now: KV blocks, sampler slots, requests).

Every request passes `guard.Guard` first (Host, API key, body size and time limits). A route
turns the body into token ids and SamplingParams off the event loop (`inputs.Preparer`), runs
it through the one engine loop (`AsyncEngine`), and shapes the result (`openai_format`);
streaming answers are server-sent events ending in `data: [DONE]`, every body strict JSON. A
client that disconnects, streaming or not, cancels its request, and the engine frees its slot
and blocks at once. On shutdown every open stream ends with an error chunk and `data: [DONE]`.
"""
from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tpsample.serve.async_engine import AsyncEngine, EngineStopped
from tpsample.serve.config import ServeConfig
from tpsample.serve.errors import error_body, install_error_handlers
from tpsample.serve.guard import Guard
from tpsample.serve.inputs import Prepared, Preparer
from tpsample.serve.openai_format import Formatter


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


def build_app(llm, *, model_name: str, max_pending: int | None = None, config: ServeConfig | None = None) -> FastAPI:
    config = config or ServeConfig()
    engine = AsyncEngine(llm, max_pending=max_pending, grammar_timeout_s=config.grammar_timeout_s)
    preparer = Preparer(engine.tokenizer, model_names=(model_name, llm.config.model),
                        max_model_len=llm.info.max_model_len, config=config)

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="tpsample", lifespan=lifespan)
    app.state.engine, app.state.serve_config = engine, config
    app.add_middleware(Guard, config=config)
    install_error_handlers(app)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if engine.alive and not engine.draining else 503)

    @app.get("/stats")
    async def stats():
        report = await engine.report()
        return {"resources": report.resources, "finished": report.finished, "in_flight": engine.num_pending,
                "max_pending": engine.max_pending, "engine": llm.info.as_dict()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "tpsample", "max_model_len": llm.info.max_model_len}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        job = await preparer.prepare("chat", await request.body())
        return await _serve(request, engine, Formatter("chat", model_name, engine.tokenizer,
                                                       return_token_ids=job.req.return_token_ids), job)

    @app.post("/v1/completions")
    async def completions(request: Request):
        job = await preparer.prepare("completion", await request.body())
        return await _serve(request, engine, Formatter("completion", model_name, engine.tokenizer,
                                                       return_token_ids=job.req.return_token_ids), job)

    return app


async def _serve(request: Request, engine: AsyncEngine, fmt: Formatter, job: Prepared):
    """Run one prepared request: a stream of events, or (cancelled by a disconnect) one JSON body."""
    gen = engine.generate(job.prompt_ids, job.params, job.guided, job.prompt_text)
    if job.req.stream:
        try:
            await gen.__anext__()               # accepted: a rejected request is a 400, not a stream
        except BaseException:
            await gen.aclose()
            raise
        include_usage = bool(job.req.stream_options and job.req.stream_options.include_usage)
        return EventStream(_stream(gen, fmt, fmt.kind, len(job.params), len(job.prompt_ids), include_usage))
    return await _cancel_on_disconnect(request, _collect(gen, fmt, job.prompt_ids))


async def _collect(gen, fmt: Formatter, prompt_ids: list[int]):
    tracked = {}
    try:
        async for t, _ in gen:
            if t is not None:
                tracked[t.index] = t
    finally:
        await gen.aclose()
    return JSONResponse(fmt.response([tracked[i] for i in sorted(tracked)], prompt_ids))


async def _stream(gen, fmt: Formatter, kind: str, n: int, prompt_len: int, include_usage: bool):
    completion_tokens = 0
    try:
        if kind == "chat":
            for i in range(n):
                yield _sse(fmt.chunk(i, {"role": "assistant", "content": ""}))
        async for t, delta in gen:
            completion_tokens += len(delta.new_token_ids)
            lps = t.logprobs[len(t.logprobs) - len(delta.new_token_ids):] if t.logprobs is not None else None
            ks = t.kept_support[len(t.kept_support) - len(delta.new_token_ids):] if t.kept_support is not None else None
            if not delta.text and not delta.finished and lps is None and ks is None and not fmt.return_token_ids:
                continue                            # text held back (a split character): nothing to say
            yield _sse(fmt.chunk(t.index, delta, lps, ks))
        if include_usage:
            yield _sse(fmt.usage_chunk(prompt_len, completion_tokens))
        yield "data: [DONE]\n\n"
    except Exception as e:          # mid-stream failure: report it in the stream, then end it
        stopped = isinstance(e, EngineStopped)
        yield _sse(error_body(503 if stopped else 500, (str(e).splitlines() or [type(e).__name__])[0],
                              code="engine_stopped" if stopped else None))
        yield "data: [DONE]\n\n"
    finally:
        await gen.aclose()
