"""Running one prepared request through the engine and answering it: a JSON body, or server-sent
events ending in `data: [DONE]`.

A formatter (`openai_format.Formatter` or `GenerateFormatter`) shapes the output: `response`
(every choice, once finished), `opening` (a choice's first chunks), `chunk` (one per delta, or
None) and `usage_chunk`. A client that disconnects, streaming or not, cancels its request (the
engine frees its slot and blocks at once); a failure mid-stream is a last chunk holding an error
body, then `data: [DONE]`. Every body is strict JSON.
"""
from __future__ import annotations

import asyncio
import json

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tpsample.serve.async_engine import AsyncEngine, EngineStopped
from tpsample.serve.errors import error_body
from tpsample.serve.inputs import Prepared


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
