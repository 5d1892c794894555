"""The OpenAI-compatible ASGI app: ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /v1/models``, ``GET /health``.

Every bad request gets an OpenAI-style error object (``{"error": {"message", "type", "param",
"code"}}``) with a 4xx status (400 bad input, 401 bad key, 404 unknown model or route, 429 full
queue, 503 shutting down) and the server goes on serving. Decoding happens on the
:class:`~dlmkit.serve.batching.Batcher`'s thread; the event loop only parses, validates and
answers, so requests keep arriving while a batch decodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import json
import time
import uuid

import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dlmkit.generate.api import check_prompt_lengths, encode_prompt

from .batching import Batcher, Decoded, Draining, Job, QueueFull
from .schemas import ChatRequest, CompletionRequest

# Sampler options that have an OpenAI field: set them there, not in the ``dlmkit`` object.
OPENAI_FIELDS = {"max_new_tokens": "max_tokens", "temperature": "temperature", "seed": "seed"}
CONFIG_CACHE = 256  # distinct option sets whose checked config the server keeps


class APIError(Exception):
    """An error answered as ``{"error": {...}}`` with ``status``."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (status, message, param,
                                                                       code, kind)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


def _validation_message(err: pydantic.ValidationError, schema) -> tuple[str, str | None]:
    """One readable line for the first problem (and how many more), and its field."""
    problems = err.errors(include_url=False)
    first = problems[0]
    where = ".".join(str(p) for p in first["loc"]) or None
    kind = first["type"]
    if kind == "json_invalid":
        message = f"request body is not valid JSON ({first['msg']})"
    elif kind == "extra_forbidden":
        message = (f"unknown field {where!r}; this endpoint takes "
                   f"{', '.join(sorted(schema.model_fields))} (dlmkit's sampler options go "
                   "in the 'dlmkit' object)")
    elif kind == "missing":
        message = f"missing required field {where!r}"
    elif not first["loc"]:
        message = f"request body: {first['msg']}"
    else:
        message = f"{where}: {first['msg']}, got {first.get('input')!r}"
    if len(problems) > 1:
        message += f" (and {len(problems) - 1} more problem(s))"
    return message, where


def _parse(schema, body: bytes):
    try:
        return schema.model_validate_json(body)
    except pydantic.ValidationError as err:
        message, where = _validation_message(err, schema)
        raise APIError(400, message, param=where) from None


def _cut_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` up to the earliest stop string, and whether one was found."""
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text, False) if at < 0 else (text[:at], True)


def _held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters of ``text`` might begin a stop string (not streamed yet)."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])),
               default=0)


class Service:
    """What the endpoints share: the model, the server's default options, the batcher."""

    def __init__(self, loaded, *, sampler: str | None, options: dict, model_id: str,
                 max_batch: int, wait_ms: float, max_queue: int,
                 api_key: str | None = None) -> None:
        self.loaded = loaded
        self.sampler = sampler
        self.options = {k: v for k, v in options.items() if k != "seed"}
        self.default_seed = options.get("seed", 0)
        self.model_id = model_id
        self.api_key = api_key
        self.batching = dict(max_batch=max_batch, wait_ms=wait_ms, max_queue=max_queue)
        self.batcher: Batcher | None = None
        # the server's own config, checked now: a bad --threshold fails at start, not per request
        self.base = loaded.config(sampler, **self.options)
        self.stop_ids = tuple(loaded.tokenizer.stop_token_ids)
        # Checked configs by the options that made them: clients send the same few option
        # sets again and again, and building and checking a config costs more than the rest
        # of a request's handling (bench/serve.py's profile, docs/serving.md).
        self._configs: dict = {}

    def start(self) -> None:
        self.batcher = Batcher(self.loaded, **self.batching)

    # -- request -> job -------------------------------------------------------------------
    def check_model(self, name: str) -> None:
        if name != self.model_id:
            raise APIError(404, f"model {name!r} is not served here; this server serves "
                                f"{self.model_id!r} (GET /v1/models)", param="model",
                           code="model_not_found")

    def encode(self, prompt) -> list[int]:
        tokenizer = self.loaded.tokenizer
        if isinstance(prompt, str):
            if not prompt.strip():
                raise APIError(400, "prompt is empty; give the text to answer", param="prompt")
            return encode_prompt(tokenizer, prompt)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            vocab = tokenizer.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary "
                                    f"[0, {vocab})", param="prompt")
            return list(prompt)
        if not prompt:
            raise APIError(400, "prompt is empty; give the text to answer", param="prompt")
        try:  # a conversation
            return encode_prompt(tokenizer, prompt)
        except ValueError as err:
            raise APIError(400, f"messages: {err}", param="messages") from None

    def configure(self, request, ids: list[int]):
        """``(SamplerConfig, canvas width)`` for a request, checked as ``dlmkit generate``
        checks its options; a problem is a 400 naming the field."""
        extension = request.dlmkit or {}
        for name, field in OPENAI_FIELDS.items():
            if name in extension:
                raise APIError(400, f"dlmkit.{name}: set the request's {field!r} field instead",
                               param=f"dlmkit.{name}")
        if "sampler" in extension:
            raise APIError(400, f"dlmkit.sampler: this server decodes with the "
                                f"{self.base.sampler!r} sampler (set by `dlmkit serve "
                                "--sampler`); a request cannot change it",
                           param="dlmkit.sampler")
        options = {**self.options, **extension}
        if request.max_tokens is not None:
            options["max_new_tokens"] = request.max_tokens
        if request.temperature is not None:
            options["temperature"] = request.temperature
        try:
            # the key keeps each value's type: 1 and 1.0 and True are different options
            key = tuple(sorted((k, type(v), v) for k, v in options.items()))
            hash(key)
        except TypeError:  # an unhashable value (a list...): checked below, never cached
            key = None
        config = self._configs.get(key) if key is not None else None
        if config is None:
            config = self._checked_config(options, extension)
            if key is not None:
                if len(self._configs) >= CONFIG_CACHE:
                    self._configs.pop(next(iter(self._configs)))
                self._configs[key] = config
        width = config.canvas_widths([len(ids)])[0]
        try:
            check_prompt_lengths(self.loaded.model, [len(ids)], [width], ["the prompt"])
        except ValueError as err:
            raise APIError(400, str(err), param="max_tokens") from None
        return config, width

    def _checked_config(self, options: dict, extension: dict):
        try:
            config = self.loaded.config(self.sampler, **options)
        except (ValueError, TypeError) as err:
            raise APIError(400, f"dlmkit: {err}", param="dlmkit") from None
        try:  # the trained block of bd3lm/hybrid; the same check as --block-size
            self.loaded.check_block_size(config, extension.get("block_size"),
                                         what="dlmkit.block_size", mode="dlmkit.mode 'ar'")
        except ValueError as err:
            raise APIError(400, str(err), param="dlmkit.block_size") from None
        return config

    def job(self, request, ids: list[int], on_tokens=None) -> Job:
        config, width = self.configure(request, ids)
        loop = asyncio.get_running_loop()
        seed = self.default_seed if request.seed is None else request.seed
        job = Job(config=config, prompt=ids, seed=seed, n=request.n, width=width, loop=loop,
                  future=loop.create_future(), on_tokens=on_tokens)
        try:
            self.batcher.submit(job)
        except QueueFull:
            raise APIError(429, f"the request queue is full ({self.batching['max_queue']} "
                                "waiting, `dlmkit serve --max-queue`); retry shortly",
                           code="queue_full", kind="rate_limit_error") from None
        except Draining:
            raise APIError(503, "the server is shutting down; it takes no new requests",
                           code="shutting_down", kind="server_error") from None
        return job

    # -- answers ----------------------------------------------------------------------------
    def text(self, tokens: list[int]) -> str:
        return self.loaded.tokenizer.decode(tokens, skip_special_tokens=True)

    def choices(self, decoded: Decoded, stops: list[str]) -> list[tuple[str, str]]:
        """Per choice ``(text, finish_reason)``."""
        out = []
        for tokens, stopped in zip(decoded.tokens, decoded.stopped):
            text, cut = _cut_stop(self.text(tokens), stops)
            out.append((text, "stop" if stopped or cut else "length"))
        return out

    def usage(self, ids: list[int], decoded: Decoded) -> dict:
        # a stop token was decoded too: it counts, as in GenerationResult.generated
        completion = sum(len(t) + s for t, s in zip(decoded.tokens, decoded.stopped))
        return {"prompt_tokens": len(ids), "completion_tokens": completion,
                "total_tokens": len(ids) + completion}

    def committed_text(self, tokens: list[int]) -> str:
        """The text of streamed tokens: up to the first stop token, a last replacement
        character held back (the start of a UTF-8 character whose next bytes may follow)."""
        stop = next((i for i, t in enumerate(tokens) if t in self.stop_ids), len(tokens))
        text = self.text(tokens[:stop])
        return text[:-1] if text.endswith("\ufffd") else text


class KeyCheck:
    """ASGI middleware: ``/v1/`` requests must send ``Authorization: Bearer KEY`` (else 401).

    A plain ASGI middleware rather than ``@app.middleware("http")``: Starlette's
    ``BaseHTTPMiddleware`` wraps every request in task groups and memory streams, a cost each
    request paid in the serving profile even with no key set.
    """

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            given = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") \
                else ""
            if not hmac.compare_digest(given.encode(), self.key):
                error = APIError(401, "missing or wrong API key: send the key given to "
                                      "`dlmkit serve --api-key` as 'Authorization: Bearer KEY'",
                                 code="invalid_api_key")
                await JSONResponse(error.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(service: Service) -> FastAPI:
    """The ASGI app over ``service`` (its batcher runs while the app's lifespan does)."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.start()
        # Everything loaded so far (torch, transformers, the model) lives as long as the
        # server: out of the collector's sight, a full collection no longer walks it. One
        # such walk stalled every request in flight for ~0.4 s (bench/serve.py, 64 clients).
        gc.collect()
        gc.freeze()
        yield
        # uvicorn has finished the requests in flight (graceful shutdown); stop the thread
        await asyncio.to_thread(service.batcher.close)

    app = FastAPI(title="dlmkit", lifespan=lifespan,
                  description="OpenAI-compatible server for dlmkit models (docs/serving.md)")

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        message = (f"no route {request.method} {request.url.path}; routes: POST "
                   "/v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health"
                   if err.status_code in (404, 405) else str(err.detail))
        return JSONResponse(APIError(err.status_code, message).body(),
                            status_code=err.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception):
        # a bug of ours: the client still gets an error object, the log the traceback
        error = APIError(500, f"internal error: {type(err).__name__}: {err}",
                         kind="server_error")
        return JSONResponse(error.body(), status_code=500)

    if service.api_key is not None:
        app.add_middleware(KeyCheck, key=service.api_key)

    @app.get("/health")
    async def health():
        batcher = service.batcher
        return {"status": "ok", "model": service.model_id, "sampler": service.base.sampler,
                "queued": batcher.queued, "decoding": batcher.decoding,
                "batches": batcher.batches}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.model_id, "object": "model",
                                            "created": 0, "owned_by": "dlmkit"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = _parse(CompletionRequest, await request.body())
        service.check_model(body.model)
        ids = service.encode(body.prompt)
        return await _answer(service, body, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = _parse(ChatRequest, await request.body())
        service.check_model(body.model)
        ids = service.encode([m.model_dump() for m in body.messages])
        return await _answer(service, body, ids, chat=True)

    return app


def _envelope(service: Service, chat: bool, stream: bool) -> dict:
    kind = ("chat.completion.chunk" if stream else "chat.completion") if chat \
        else "text_completion"
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "object": kind,
            "created": int(time.time()), "model": service.model_id}


async def _answer(service: Service, body, ids: list[int], *, chat: bool):
    try:
        stops = body.stop_strings()
    except ValueError as err:
        raise APIError(400, str(err), param="stop") from None
    if body.stream:
        return _stream(service, body, ids, stops, chat=chat)
    job = service.job(body, ids)
    try:
        decoded = await job.future
    except asyncio.CancelledError:
        job.cancelled = True
        raise
    except ValueError as err:
        raise APIError(400, str(err)) from None
    except Exception as err:
        raise APIError(500, f"decoding failed: {type(err).__name__}: {err}",
                       kind="server_error") from None
    choices = []
    for index, (text, reason) in enumerate(service.choices(decoded, stops)):
        choice = {"index": index, "finish_reason": reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        choices.append(choice)
    # a JSONResponse of plain JSON types: FastAPI would otherwise walk a returned dict
    # through its encoder first
    return JSONResponse({**_envelope(service, chat, False), "choices": choices,
                         "usage": service.usage(ids, decoded),
                         "dlmkit": {"sampler": job.config.sampler,
                                    "batch_rows": decoded.batch_rows,
                                    "tokens": decoded.tokens}})


def _stream(service: Service, body, ids: list[int], stops: list[str], *, chat: bool):
    """Server-sent events: a chunk per committed block (block-wise samplers) or one chunk with
    the whole answer (mdlm, scdd), each choice's ``finish_reason`` chunk, then ``[DONE]``."""
    events: asyncio.Queue = asyncio.Queue()
    job = service.job(body, ids, on_tokens=lambda c, t: events.put_nowait(("tokens", c, t)))
    job.future.add_done_callback(lambda f: events.put_nowait(("done", None, None)))
    head = _envelope(service, chat, True)

    def chunk(index: int, text: str | None, reason: str | None) -> str:
        if chat:
            delta = {} if text is None else {"content": text}
            if text is not None and index in first:
                delta = {"role": "assistant", **delta}
                first.discard(index)
            choice = {"index": index, "delta": delta, "finish_reason": reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None,
                      "finish_reason": reason}
        return f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"

    first = set(range(body.n))
    sent = [""] * body.n
    closed = [False] * body.n

    def advance(index: int, text: str, final: bool) -> list[str]:
        """Chunks that bring choice ``index`` from what was sent to ``text``."""
        if closed[index]:
            return []
        text, cut = _cut_stop(text, stops)
        if not (final or cut):
            text = text[:len(text) - _held_back(text, stops)]
        if not text.startswith(sent[index]):  # a decode of a longer prefix changed earlier text
            return []
        out = [chunk(index, text[len(sent[index]):], None)] if len(text) > len(sent[index]) \
            else []
        sent[index] = text
        if cut:
            closed[index] = True
            out.append(chunk(index, None, "stop"))
        return out

    async def produce():
        try:
            while True:
                kind, index, tokens = await events.get()
                if kind == "tokens":
                    for line in advance(index, service.committed_text(tokens), False):
                        yield line
                    continue
                try:
                    decoded = job.future.result()
                except Exception as err:  # noqa: BLE001 - reported in the stream, then closed
                    error = APIError(500, f"decoding failed: {type(err).__name__}: {err}",
                                     kind="server_error")
                    yield f"data: {json.dumps(error.body())}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                for index, (text, reason) in enumerate(service.choices(decoded, [])):
                    if closed[index]:
                        continue
                    for line in advance(index, text, True):
                        yield line
                    if not closed[index]:
                        closed[index] = True
                        yield chunk(index, None, reason)
                yield "data: [DONE]\n\n"
                return
        finally:  # the client went away (or all is sent): nothing more to decode for it
            job.cancelled = True

    return StreamingResponse(produce(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
