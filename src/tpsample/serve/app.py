"""The OpenAI-compatible HTTP app: /v1/chat/completions, /v1/completions, /v1/models, /health,
and /stats (what the engine holds right now: KV blocks, sampler slots, requests).

Every route turns a request body into token ids and SamplingParams (`protocol`), runs it
through the one engine loop (`AsyncEngine`), and shapes the result (`openai_format`); streaming
answers are server-sent events ending in `data: [DONE]`. A client that disconnects, streaming
or not, cancels its request, and the engine frees its slot and blocks at once.
"""
from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tpsample.engine.prompts import chat_prompts, normalize_prompts
from tpsample.serve import protocol as P
from tpsample.serve.async_engine import AsyncEngine, EngineStopped
from tpsample.serve.errors import ModelNotFound, error_body, install_error_handlers
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
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


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


def build_app(llm, *, model_name: str, max_pending: int | None = None) -> FastAPI:
    engine = AsyncEngine(llm, max_pending=max_pending)

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="tpsample", lifespan=lifespan)
    app.state.engine = engine
    install_error_handlers(app)

    def check_model(req) -> None:
        if req.model not in (None, "", model_name, llm.config.model):
            raise ModelNotFound(f"The model `{req.model}` does not exist; this server serves `{model_name}`")

    @app.get("/health")
    async def health():
        return Response(status_code=200 if engine.alive else 503)

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
    async def chat(req: P.ChatCompletionRequest, request: Request):
        check_model(req)
        texts, ids = chat_prompts(P.chat_messages(req.messages), engine.tokenizer)
        return await _serve(request, req, "chat", ids[0], texts[0])

    @app.post("/v1/completions")
    async def completions(req: P.CompletionRequest, request: Request):
        check_model(req)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt = [prompt]                       # OpenAI: a flat list of ints is one prompt
        texts, ids = normalize_prompts(prompt, engine.tokenizer, model_name)
        if len(ids) != 1:
            raise ValueError("prompt: give one prompt per request (a string or a list of token ids)")
        return await _serve(request, req, "completion", ids[0], texts[0])

    async def _serve(request: Request, req, kind: str, prompt_ids: list[int], prompt_text):
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        params = P.sampling_params(req, P.max_tokens(req, len(prompt_ids), llm.info.max_model_len))
        guided = P.guided_decoding(req)
        fmt = Formatter(kind, model_name, engine.tokenizer, return_token_ids=req.return_token_ids)
        gen = engine.generate(prompt_ids, params, guided, prompt_text)
        if req.stream:
            try:
                await gen.__anext__()               # accepted: a rejected request is a 400, not a stream
            except BaseException:
                await gen.aclose()
                raise
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return EventStream(_stream(gen, fmt, kind, len(params), len(prompt_ids), include_usage))
        return await _cancel_on_disconnect(request, _collect(gen, fmt, prompt_ids))

    return app


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
            if not delta.text and not delta.finished and lps is None and not fmt.return_token_ids:
                continue                            # text held back (a split character): nothing to say
            yield _sse(fmt.chunk(t.index, delta, lps))
        if include_usage:
            yield _sse(fmt.usage_chunk(prompt_len, completion_tokens))
        yield "data: [DONE]\n\n"
    except Exception as e:          # mid-stream failure: report it in the stream, then end it
        yield _sse(error_body(503 if isinstance(e, EngineStopped) else 500, str(e).splitlines()[0]))
        yield "data: [DONE]\n\n"
    finally:
        await gen.aclose()
