"""The HTTP endpoints (FastAPI): ``/v1/completions``, ``/v1/chat/completions`` (streamed
over server-sent events or whole), ``/v1/models``, ``/health``, ``/metrics``.

Every refusal is an OpenAI error body with a 4xx status; nothing a client sends produces a
traceback (an internal fault is a 500 with a one-line message, logged on the server).
Each response says how it was paced (``x-kvsim-pace``) and, under ``--pace real``, how late
its tokens left (``x-kvsim-lag-s``, ``x-kvsim-behind``: the lag at the first token of a
stream, the largest lag of a whole response); each chunk carries its token's simulated
time (``kvsim.t_s``) and the last one the request's simulated figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from sim.app.server.engine import Closing, Live, Piece
from sim.app.server.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    sse,
    usage,
    validation_errors,
)
from sim.app.server.service import Service
from sim.app.server.text import Sampling
from sim.units import PS_PER_S

log = logging.getLogger("kvsim.server")


def server_for(svc: Service, app: FastAPI):
    """uvicorn's server for ``app``, which on SIGINT/SIGTERM (or ``should_exit``) stops
    accepting connections, lets the engine finish its requests for up to
    ``server.shutdown_grace_s`` and cancel the rest (each stream then ends with its last
    chunk or an error event), and only then lets uvicorn close the connections."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            for server in self.servers:
                server.close()
            await svc.engine.drain(svc.cfg.server.shutdown_grace_s)
            await super().shutdown(sockets)

    return DrainingServer(uvicorn.Config(app, log_level="warning", access_log=False,
                                         lifespan="on",
                                         timeout_graceful_shutdown=CLOSE_GRACE_S))


#: Seconds uvicorn waits for connections to close after the engine has drained (each
#: response has then sent its last chunk or error).
CLOSE_GRACE_S = 5.0


def create_app(svc: Service, *, on_stop: Callable[[], None] | None = None) -> FastAPI:
    """The app over a built service; ``on_stop`` runs after the engine has drained."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        _warm(svc)
        svc.engine.start()
        try:
            yield
        finally:
            await svc.engine.drain(svc.cfg.server.shutdown_grace_s)
            svc.text.close()
            if on_stop is not None:
                on_stop()

    app = FastAPI(title="kvsim", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.add_middleware(BodyLimit, limit=svc.cfg.server.max_body_bytes)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        e = validation_errors(list(err.errors()))
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(err.detail)), status_code=err.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, err: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return JSONResponse(error_body(f"internal error: {type(err).__name__}",
                                       kind="server_error"), status_code=500)

    @app.get("/health")
    async def health() -> JSONResponse:
        if svc.engine.failed is not None:
            return JSONResponse(error_body(svc.engine.failed, kind="server_error"), 503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{
            "id": svc.model_name, "object": "model", "created": svc.created,
            "owned_by": "kvsim", "max_model_len": svc.max_model_len}]})

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _serve(svc, body, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _serve(svc, body, request, chat=True)

    return app


def _warm(svc: Service) -> None:
    """Run the text paths once before the first client (the chat template's first render
    and the tokenizer's first calls take tens of milliseconds a request would pay)."""
    tok = svc.tok
    ids = tok.encode("kvsim warms up")
    tok.decode(ids)
    if tok.chat_template:
        tok.apply_chat_template([{"role": "user", "content": "kvsim warms up"}])


class BodyLimit:
    """Refuses (413) a request body over ``limit`` bytes, by its Content-Length or as it
    comes in, before the app sees it: the body is read here and handed on whole."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # when the request arrived (its headers), before its body is read and checked:
        # the simulated arrival is this time, not the time the engine takes it
        state = scope.setdefault("state", {})
        state["received"] = asyncio.get_running_loop().time()
        state["received_unix"] = time.time()  # the same moment on the machine's clock
        for k, v in scope.get("headers", []):
            if k == b"content-length" and (not v.isdigit() or int(v) > self.limit):
                return await _send_error(scope, send, 413,
                                         f"the body exceeds {self.limit} bytes")
        parts, seen = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away
                return
            seen += len(msg.get("body", b""))
            if seen > self.limit:
                return await _send_error(scope, send, 413,
                                         f"the body exceeds {self.limit} bytes")
            parts.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body = b"".join(parts)
        given = False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _send_error(scope, send, status: int, message: str) -> None:
    resp = JSONResponse(error_body(message), status_code=status)
    await resp(scope, None, send)


# --- one request -------------------------------------------------------------------------
def _prompt_ids(svc: Service, body: Any, chat: bool) -> list[int]:
    tok = svc.tok
    if chat:
        msgs = [{"role": m.role, "content": m.text()} for m in body.messages]
        if tok.chat_template:
            text = tok.apply_chat_template(msgs)
        else:  # a tokenizer without a template (bytes): "role: content" lines
            text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:"
        ids = tok.encode(text)
    else:
        p = body.prompt
        if isinstance(p, list) and p and not isinstance(p[0], int):
            if len(p) != 1:
                raise ApiError(400, f"prompt: one prompt per request (got {len(p)})",
                               param="prompt")
            p = p[0]
        ids = tok.encode(p) if isinstance(p, str) else list(p)
        bad = [i for i in ids if not 0 <= i < svc.vocab_size]
        if bad:
            raise ApiError(400, f"prompt: token id {bad[0]} is outside the vocabulary "
                           f"(0..{svc.vocab_size - 1})", param="prompt")
    if not ids:
        raise ApiError(400, "the prompt has no tokens", param="messages" if chat else "prompt")
    return ids


def _sampling(svc: Service, body: Any, n_prompt: int, chat: bool) -> Sampling:
    limit = svc.max_model_len
    asked = getattr(body, "max_completion_tokens", None) or body.max_tokens
    max_tokens = asked if asked is not None else limit - n_prompt
    where = "messages" if chat else "prompt"
    if max_tokens < 1 or n_prompt + max_tokens > limit:
        raise ApiError(400, f"This model's maximum context length is {limit} tokens. "
                       f"However, you requested {n_prompt + max(max_tokens, 1)} tokens "
                       f"({n_prompt} in the {where}, {max(max_tokens, 1)} in the completion). "
                       "Please reduce the length of the messages or completion.",
                       param=where, code="context_length_exceeded")
    if not svc.engine.fits(n_prompt, max_tokens):
        raise ApiError(400, f"{n_prompt} + {max_tokens} tokens need more KV cache than one "
                       f"chip holds ({svc.parts.geometry.capacity_tokens()} tokens)",
                       param=where, code="context_length_exceeded")
    if body.min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens: {body.min_tokens} is more than max_tokens "
                       f"({max_tokens})", param="min_tokens")
    return Sampling(max_tokens=max_tokens,
                    temperature=1.0 if body.temperature is None else body.temperature,
                    seed=body.seed, stop=body.stops(), ignore_eos=body.ignore_eos,
                    min_tokens=body.min_tokens)


async def _serve(svc: Service, body: Any, request: Request, *, chat: bool) -> Response:
    if body.model != svc.model_name:
        raise ApiError(404, f"The model `{body.model}` does not exist (this server has "
                       f"`{svc.model_name}`).", param="model", code="model_not_found")
    body.refuse_unsupported()
    ids = _prompt_ids(svc, body, chat)
    sampling = _sampling(svc, body, len(ids), chat)
    client_id = request.headers.get("x-request-id")
    received = getattr(request.state, "received", None)
    try:
        live = svc.engine.submit(ids, sampling, received=received, client_id=client_id,
                                 received_unix=getattr(request.state, "received_unix", None),
                                 endpoint="chat" if chat else "completions",
                                 stream_mode=bool(body.stream))
    except Closing as err:
        raise ApiError(503, f"the server cannot take requests: {err}",
                       kind="server_error") from None
    fmt = _Format(svc, live, chat, len(ids), body)
    if body.stream:
        first = await _race(live.pieces.get(), request)
        if first is None:  # the client went away before the first token
            svc.engine.cancel(live)
            return Response(status_code=499)
        if first.finish in ("error", "cancelled"):
            return _ended_early(first)
        return StreamingResponse(_stream(svc, live, fmt, first), media_type="text/event-stream",
                                 headers=fmt.headers(first.lag_s))
    pieces = await _race(_collect(live), request)
    if pieces is None:
        svc.engine.cancel(live)
        return Response(status_code=499)
    last = pieces[-1]
    if last.finish in ("error", "cancelled"):
        return _ended_early(last)
    return JSONResponse(fmt.whole(pieces), headers=fmt.headers(live.lag_max_s))


def _ended_early(last: Piece) -> JSONResponse:
    if last.finish == "error":
        return JSONResponse(error_body(last.error or "the request failed",
                                       kind="server_error"), status_code=500)
    return JSONResponse(error_body("the server shut down before the request finished",
                                   kind="server_error"), status_code=503)


async def _collect(live: Live) -> list[Piece]:
    out = []
    while True:
        p = await live.pieces.get()
        out.append(p)
        if p.finish is not None:
            return out


async def _race(aw, request: Request):
    """``aw``'s result, or None if the client disconnects first (``aw`` is cancelled)."""
    task = asyncio.ensure_future(aw)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream(svc: Service, live: Live, fmt: _Format, first: Piece) -> AsyncIterator[str]:
    try:
        p = first
        while True:
            if p.finish in ("error", "cancelled"):
                why = p.error if p.finish == "error" else "the server shut down"
                yield sse(error_body(why or "the request failed", kind="server_error"))
                return
            yield sse(fmt.chunk(p))
            if p.finish is not None:
                break
            p = await live.pieces.get()
        if fmt.include_usage:
            yield sse(fmt.usage_chunk())
        yield sse("[DONE]")
    finally:  # the client went away (the response was cancelled), or the stream ended
        svc.engine.cancel(live)


class _Format:
    """The response's JSON: whole, or chunk by chunk."""

    def __init__(self, svc: Service, live: Live, chat: bool, n_prompt: int, body: Any):
        self.svc, self.live, self.chat, self.n_prompt = svc, live, chat, n_prompt
        opts = body.stream_options
        self.include_usage = bool(opts and opts.include_usage)
        self.continuous = bool(opts and opts.continuous_usage_stats)
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-kvsim-{live.rid}"
        self.sent_role = False

    def headers(self, lag_s: float | None) -> dict[str, str]:
        svc = self.svc
        h = {"x-kvsim-pace": svc.pace_header(), "x-kvsim-text": svc.text_header(),
             "x-request-id": self.live.client_id or self.id}
        if svc.cfg.server.pace == "real":
            lag = lag_s or 0.0
            h["x-kvsim-lag-s"] = f"{lag:.6f}"
            h["x-kvsim-behind"] = "1" if lag > svc.cfg.server.lag_tolerance_s else "0"
        return h

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.svc.created,
                "model": self.svc.model_name, "system_fingerprint": self.svc.text_header()}

    def _usage(self) -> dict[str, int]:
        return usage(self.n_prompt, len(self.live.tokens))

    def summary(self) -> dict[str, Any]:
        """The request's simulated figures (seconds on the simulated clock)."""
        r, s = self.live.req, PS_PER_S
        ts = r.token_ps
        return {"rid": self.live.rid, "chip": r.chip, "arrival_s": r.arrival_ps / s,
                "first_token_s": ts[0] / s if ts else None,
                "finish_s": r.finish_ps / s if r.finish_ps is not None else None,
                "ttft_s": (ts[0] - r.arrival_ps) / s if ts else None,
                "tpot_s": (ts[-1] - ts[0]) / s / (len(ts) - 1) if len(ts) > 1 else None,
                "preemptions": r.preemptions, "lag_max_s": self.live.lag_max_s,
                "text": self.svc.text.describe()}

    def chunk(self, p: Piece) -> dict[str, Any]:
        ext: dict[str, Any] = {"token": p.token_index, "t_s": p.t_ps / PS_PER_S,
                               "lag_s": p.lag_s}
        if p.finish is not None:
            ext["request"] = self.summary()
        if self.chat:
            delta: dict[str, Any] = {"content": p.text}
            if not self.sent_role:
                delta = {"role": "assistant", **delta}
                self.sent_role = True
            choice = {"index": 0, "delta": delta, "logprobs": None,
                      "finish_reason": p.finish}
            out = self._head("chat.completion.chunk") | {"choices": [choice]}
        else:
            choice = {"index": 0, "text": p.text, "logprobs": None, "finish_reason": p.finish}
            out = self._head("text_completion") | {"choices": [choice]}
        if self.continuous:
            out["usage"] = self._usage()
        out["kvsim"] = ext
        return out

    def usage_chunk(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self._head(obj) | {"choices": [], "usage": self._usage()}

    def whole(self, pieces: list[Piece]) -> dict[str, Any]:
        text = "".join(p.text for p in pieces)
        finish = pieces[-1].finish
        ext = self.summary() | {"token_times_s": [t / PS_PER_S for t in self.live.req.token_ps],
                                "token_ids": list(self.live.tokens)}
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish}
            out = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            out = self._head("text_completion")
        return out | {"choices": [choice], "usage": self._usage(), "kvsim": ext}
