"""An OpenAI-compatible HTTP server in front of the current policy, recording what it samples per episode.

Agent programs (plain OpenAI-client code: `OpenAI(base_url=gateway.base_url, api_key=key)`) talk to the policy
through `Gateway`; each API key (`open_episode`) names one episode, and `close_episode` hands back its
`EpisodeRecord`: per call the exact prompt ids, sampled ids and sampler logprobs (rlvr.gateway.record), so the
trainer trains on exactly what was sampled and never re-tokenizes text.

Endpoints (FastAPI under uvicorn, in a background thread of this process):
- GET  /v1/models                the one model, `model_name` (no key needed)
- POST /v1/chat/completions      messages (+ tools) rendered with the tokenizer's chat template
- POST /v1/completions           prompt: a string, or a list of token ids (token-in)

Sampling is the run's: temperature, top_p and top_k come from `spec` (the distribution the trainer scores);
request values that differ, and penalties / logit_bias / min_p / response_format, are ignored and counted
(gateway/overridden_params). A call's max_tokens is min(the request's max_tokens / max_completion_tokens,
spec.max_tokens, what is left of the episode's max_tokens_total, the room left in the context); a request that
names a max_tokens the context cannot hold is refused (400, code context_length_exceeded), one that names none
is cut to the room left, as vLLM does. Request `stop` strings join the spec's. `n` must be 1 (open one episode
per sample). A request's `seed` is ignored: call k of an episode samples with sequence_seed(episode seed, k, 0)
when it is generated alone; calls generated together (one batch) share a seed mixed from theirs (each row still
draws from its own stream), so an episode replays exactly when its calls are not batched with others'.

Token-in/token-out across turns (the drift vLLM's chat endpoint has, which SkyRL and verifiers work around), in
two ways. The message splice (chat): when a request repeats the episode's last chat conversation (its messages and
the assistant message the gateway answered, compared by role, text and tool calls, with the same tools) and adds
messages (tool results, a user turn), its ids are the last call's prompt ids + sampled ids + the template's
rendering of the added messages alone (a conversation [user, assistant MARK, *added] rendered and cut after the
mark; the template's end-of-turn text dropped where the sampled end token stands for it). The earlier turns are
never rendered again, so a template that writes history differently from what was sampled (strips reasoning,
normalizes whitespace, re-serializes tool calls) does not break the sequence: the model sees, and the trainer
scores, its own tokens. Otherwise the text splice: per episode and endpoint the gateway keeps the last call's
prompt text and ids and its completion ids and text
(decoded with special tokens). When the next rendered prompt starts with that prompt text + completion text (or,
when the completion ended with a special token such as EOS that the template does not write back, + the text
before it), its ids are the last prompt ids + completion ids + the rest encoded alone; otherwise the whole text is encoded (the
history was rewritten; the merge then starts a new Segment; counted as gateway/prefix_breaks). A chat prompt is
encoded without special tokens added (chat templates write their own BOS), a completions prompt with them
(what the tokenizer adds, e.g. a BOS), as vLLM does.

Batching: requests are queued; one worker thread takes what is queued and collects more until every open episode
has a call in the batch (synchronous agents all waiting: nothing more can come), or no request came for
batch_wait_s, or max_wait_s after the batch's first, or max_batch; it groups the batch by the per-call spec
(max_tokens, stop) and calls generator.generate once per group.
The generator is only ever called from that thread.

Tool calls: with `tools` in a chat request (and tool_choice not "none"), the completion is parsed by
rlvr.gateway.tools.TOOL_PARSERS[tool_parser] into OpenAI tool_calls (finish_reason "tool_calls"); the
content returned is the text without them. Assistant messages sent back have their tool_calls' JSON `arguments`
turned into objects for the template (as vLLM does); whether the re-rendered call matches what the model wrote
depends on the template (a mismatch is a prefix break, not an error).

`stream: true` is answered as server-sent events with the whole completion in ONE chunk, then `data: [DONE]`:
streaming is accepted for clients that insist on it, not incremental. `logprobs` returns each token's sampler
logprob (top_logprobs are empty lists: the sampler keeps only the chosen token's). `return_token_ids: true`
(vLLM's name) adds `prompt_token_ids` to the response and `token_ids` to its choice.

Errors never crash the server or the trainer; they are answered in OpenAI's shape
{"error": {"message", "type", "param", "code"}}: 401 for a missing, unknown or closed key; 400 for a body that
is not JSON or misses a field, n > 1, a prompt over the context (code context_length_exceeded), a spent episode
budget (max_tokens_total_exceeded, max_calls_exceeded); 500 when generation fails; 503 once stop() began. Every
refused request with a valid key is appended to its episode's `errors` as "STATUS message".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import queue
import secrets
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from rlvr.gateway.record import CallRecord, EpisodeRecord
from rlvr.gateway.tools import get_tool_parser
from rlvr.models.positions import max_positions
from rlvr.rollout.types import SamplingSpec, sequence_seed

AGENTS_HINT = "the gateway needs fastapi and uvicorn: pip install 'rlvr[agents]'"
try:  # at module level: FastAPI reads the handlers' (string) annotations from this module's globals
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException
except ImportError as _exc:
    raise ImportError(AGENTS_HINT) from _exc


class GatewayError(Exception):
    """A request answered with an error status in OpenAI's shape."""

    TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
             405: "invalid_request_error", 500: "server_error", 503: "server_error"}

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


@dataclass
class _Last:
    """The last answered call of an episode on one endpoint, for the token-in/token-out splice."""

    prompt_text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_text: str  # decoded WITH special tokens: what the template writes back
    # when the completion ended with a special token (EOS) that a template may not write back (one that ends a turn
    # with a newline, not an end token): the completion's text without it; None otherwise
    open_text: str | None = None
    # chat: the request's messages (as _message_key reads them) and the assistant message answered, and the tools
    messages: tuple | None = None
    tools: str | None = None


@dataclass
class _Episode:
    key: str
    name: str
    seed: int
    max_tokens_total: int | None
    max_calls: int | None
    calls: list[CallRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    next_index: int = 0  # calls accepted so far (the next call's index)
    used_tokens: int = 0  # completion tokens of answered calls
    reserved: int = 0  # max_tokens of calls in flight
    last: dict[str, _Last] = field(default_factory=dict)
    open: bool = True


@dataclass
class _Prepared:
    """A request read and checked, ready to be queued."""

    endpoint: str  # "chat" | "completions"
    prompt_text: str
    prompt_ids: list[int]
    spec: SamplingSpec  # the call's spec, seed not set yet
    stream: bool
    logprobs: bool
    include_usage: bool
    return_token_ids: bool
    parse_tools: bool
    messages: tuple | None = None  # chat: the request's message keys (_message_key), for the next call's splice
    tools: str | None = None  # chat: the request's tools as canonical JSON


@dataclass(eq=False)
class _Job:
    episode: _Episode
    prep: _Prepared
    index: int
    seed: int
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class _Counters:
    calls: int = 0
    errors: int = 0
    overridden: int = 0
    generate_calls: int = 0
    generate_rows: int = 0
    generate_s: float = 0.0
    overhead_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefix_breaks: int = 0
    dropped: int = 0


# request fields that would change the sampled distribution, and their neutral values
_NEUTRAL = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


def _mix_seeds(seeds: list[int]) -> int:
    s = 0
    for x in sorted(seeds):
        s = sequence_seed(s, x & ((1 << 62) - 1), 1)
    return s


def _default_context(generator) -> int | None:
    n = getattr(generator, "max_model_len", None)
    if isinstance(n, int) and n > 0:
        return n
    return max_positions(getattr(generator, "model", None))


class Gateway:
    """The OpenAI-compatible server; see the module docstring.

    generator: an rlvr Generator (generate(prompts, spec, prompt_ids=...), weight_version). tokenizer: its
    tokenizer (chat template, encode, decode). spec: the run's SamplingSpec (settable between steps; `n`, `seed`
    and `logprobs` are the gateway's). max_context: prompt + completion tokens a call may use (default: the
    generator's max_model_len, else its model's max_position_embeddings; None = unchecked).
    """

    def __init__(self, generator, tokenizer, spec: SamplingSpec, *, model_name: str = "policy",
                 host: str = "127.0.0.1", port: int = 0, max_batch: int = 64, batch_wait_s: float = 0.02,
                 tool_parser: str = "hermes", max_context: int | None = None, max_wait_s: float = 0.2):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0, got {batch_wait_s}")
        self.generator, self.tokenizer, self.spec = generator, tokenizer, spec
        self._special_ids = set(getattr(tokenizer, "all_special_ids", None) or ())
        self.model_name, self.host, self.port = model_name, host, port
        self.max_batch, self.batch_wait_s, self.max_wait_s = max_batch, batch_wait_s, max(max_wait_s, batch_wait_s)
        self.tool_parser_name = tool_parser
        self.tool_parser = get_tool_parser(tool_parser)
        self.max_context = max_context if max_context is not None else _default_context(generator)
        self.base_url = ""
        self._episodes: dict[str, _Episode] = {}
        self._lock = threading.Lock()  # episodes, the queue's admission, in-flight jobs, counters
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._inflight: set[_Job] = set()
        self._stopping = threading.Event()
        self._server = None
        self._http_thread: threading.Thread | None = None
        self._worker: threading.Thread | None = None
        self._m = _Counters()

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def start(self) -> Gateway:
        """Bind (port 0: a free port), start the worker and the HTTP server, and return once it serves."""
        if self._server is not None:
            raise RuntimeError("the gateway is already started")
        if self._stopping.is_set():
            raise RuntimeError("a stopped gateway does not start again: make a new one")
        try:
            import uvicorn
        except ImportError as exc:
            raise ImportError(AGENTS_HINT) from exc
        app = self._app()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on connections of a socket that says it is TCP (proto 0
        # does not); without it every response waits ~40 ms for the client's delayed ACK (Nagle), 44 ms a call
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        port = sock.getsockname()[1]

        class _ThreadServer(uvicorn.Server):
            # signals belong to the main thread's program (the trainer), never to the gateway
            def install_signal_handlers(self) -> None:
                pass

        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", loop="asyncio",
                                timeout_graceful_shutdown=1, timeout_keep_alive=30)
        self._server = server = _ThreadServer(config)
        self._worker = threading.Thread(target=self._work, name="rlvr-gateway-worker", daemon=True)
        self._worker.start()
        self._http_thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                             name="rlvr-gateway-http", daemon=True)
        self._http_thread.start()
        deadline = time.monotonic() + 30.0
        while not server.started:
            if not self._http_thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the gateway's HTTP server did not start on {self.host}:{port}")
            time.sleep(0.005)
        host = f"[{self.host}]" if family == socket.AF_INET6 else self.host
        self.port, self.base_url = port, f"http://{host}:{port}/v1"
        return self

    def stop(self) -> None:
        """End the worker and the server (within a second or two); queued and in-flight requests get 503. A
        generate() already running finishes in the worker thread, its results dropped."""
        with self._lock:
            if self._stopping.is_set():
                return
            self._stopping.set()
            pending = list(self._inflight)
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    pending.append(job)
            self._inflight.clear()
        for job in pending:
            self._resolve(job, error=GatewayError(503, "the gateway is shutting down", code="service_unavailable"))
        self._queue.put(None)
        if self._server is not None:
            self._server.should_exit = True
        if self._http_thread is not None:
            self._http_thread.join(timeout=3.0)
        if self._worker is not None:
            self._worker.join(timeout=1.0)

    def __enter__(self) -> Gateway:
        return self.start() if self._server is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- episodes --------------------------------------------------------------------------------------------------
    def open_episode(self, name: str, *, seed: int, max_tokens_total: int | None = None,
                     max_calls: int | None = None) -> str:
        """A fresh API key naming a new episode. seed: the episode's base seed (call k samples with
        sequence_seed(seed, k, 0)); max_tokens_total: completion tokens over all its calls; max_calls: calls it
        may make (None = no limit). A request over either budget is refused (400)."""
        key = f"rlvr-{secrets.token_hex(16)}"
        with self._lock:
            self._episodes[key] = _Episode(key, name, int(seed), max_tokens_total, max_calls)
        return key

    def close_episode(self, key: str) -> EpisodeRecord:
        """The episode's record; afterwards its key is refused (401). KeyError for a key not open."""
        with self._lock:
            ep = self._episodes.pop(key, None)
            if ep is None:
                raise KeyError(f"no open episode has the key {key[:12]}...")
            ep.open = False
            return EpisodeRecord(key=ep.key, name=ep.name, calls=list(ep.calls), errors=list(ep.errors))

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """gateway/* counters since the last reset (by default every call resets them: one read per step):
        calls answered, errors (refused or failed requests), overridden_params (sampling fields ignored),
        batch_size_mean (rows per generate call), overhead_s_mean (server time per call minus its generate
        time, queueing included), generate_s_mean, generate_calls, prompt_tokens_mean, completion_tokens_mean,
        prefix_breaks (calls whose history did not extend the episode's last call), dropped_calls (answered
        after their episode was closed), episodes_open."""
        with self._lock:
            m, open_ = self._m, len(self._episodes)
            if reset:
                self._m = _Counters()
        calls, gens = max(m.calls, 1), max(m.generate_calls, 1)
        return {"gateway/calls": float(m.calls), "gateway/errors": float(m.errors),
                "gateway/overridden_params": float(m.overridden),
                "gateway/batch_size_mean": m.generate_rows / gens, "gateway/overhead_s_mean": m.overhead_s / calls,
                "gateway/generate_s_mean": m.generate_s / gens, "gateway/generate_calls": float(m.generate_calls),
                "gateway/prompt_tokens_mean": m.prompt_tokens / calls,
                "gateway/completion_tokens_mean": m.completion_tokens / calls,
                "gateway/prefix_breaks": float(m.prefix_breaks), "gateway/dropped_calls": float(m.dropped),
                "gateway/episodes_open": float(open_)}

    # -- the worker ------------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            batch, first = [job], time.monotonic()
            last = first
            done = False
            while len(batch) < self.max_batch:
                with self._lock:  # every open episode is waiting on a call of this batch: nothing more can come
                    if len(batch) >= len(self._episodes):
                        break
                wait = min(last + self.batch_wait_s, first + self.max_wait_s) - time.monotonic()
                try:
                    nxt = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    done = True
                    break
                batch.append(nxt)
                last = time.monotonic()
            with self._lock:
                if self._stopping.is_set():
                    stopped, batch = batch, []
                else:
                    stopped = []
                    batch = [j for j in batch if not j.future.done()]
                    self._inflight.update(batch)
            for j in stopped:
                self._resolve(j, error=GatewayError(503, "the gateway is shutting down", code="service_unavailable"))
            groups: dict[SamplingSpec, list[_Job]] = {}
            for j in batch:
                groups.setdefault(j.prep.spec, []).append(j)
            for spec, jobs in groups.items():
                if self._stopping.is_set():
                    break
                self._generate(spec, jobs)
            if done:
                return

    def _generate(self, spec: SamplingSpec, jobs: list[_Job]) -> None:
        version = int(getattr(self.generator, "weight_version", 0))
        seed = jobs[0].seed if len(jobs) == 1 else _mix_seeds([j.seed for j in jobs])
        t0 = time.monotonic()
        try:
            out = self.generator.generate([j.prep.prompt_text for j in jobs], replace(spec, seed=seed),
                                          prompt_ids=[j.prep.prompt_ids for j in jobs])
            if len(out) != len(jobs):
                raise RuntimeError(f"the generator returned {len(out)} rollouts for {len(jobs)} prompts")
        except Exception as exc:  # noqa: BLE001 - a failed generation is those requests' 500, never the server's end
            msg = f"generation failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            for j in jobs:
                self._resolve(j, error=GatewayError(500, msg[:500], code="generation_failed"))
            return
        dt = time.monotonic() - t0
        with self._lock:
            self._m.generate_calls += 1
            self._m.generate_rows += len(jobs)
            self._m.generate_s += dt
        for j, ro in zip(jobs, out, strict=True):
            self._resolve(j, result=(ro, version, dt))

    def _resolve(self, job: _Job, *, result=None, error: GatewayError | None = None) -> None:
        with self._lock:
            self._inflight.discard(job)
        try:
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)
        except concurrent.futures.InvalidStateError:  # already answered (503 at stop)
            pass

    # -- the HTTP app ----------------------------------------------------------------------------------------------
    def _app(self):
        app = FastAPI(title="rlvr gateway", docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(HTTPException)
        async def http_error(request: Request, exc: HTTPException):  # unknown path, wrong method: OpenAI's shape
            err = GatewayError(exc.status_code, str(exc.detail))
            return JSONResponse(err.body(), status_code=exc.status_code)

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                "owned_by": "rlvr", "max_model_len": self.max_context}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await self._handle(request, "chat")

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await self._handle(request, "completions")

        return app

    async def _handle(self, request, endpoint: str):
        t0 = time.monotonic()
        ep = None
        try:
            if self._stopping.is_set():
                raise GatewayError(503, "the gateway is shutting down", code="service_unavailable")
            ep = self._episode_of(request.headers.get("authorization"))
            try:
                body = json.loads(await request.body())
            except (ValueError, UnicodeDecodeError) as exc:
                raise GatewayError(400, f"the request body is not JSON: {exc}"[:300]) from None
            if not isinstance(body, dict):
                raise GatewayError(400, "the request body must be a JSON object")
            prep = self._prepare_chat(ep, body) if endpoint == "chat" else self._prepare_completions(ep, body)
            job = self._submit(ep, prep)
            try:
                ro, version, gen_s = await asyncio.wrap_future(job.future)
            finally:
                with self._lock:
                    ep.reserved -= prep.spec.max_tokens
            payload = self._answer(ep, job, ro, version)
            with self._lock:
                self._m.overhead_s += max(0.0, time.monotonic() - t0 - gen_s)
        except GatewayError as err:
            self._refuse(ep, err)
            return JSONResponse(err.body(), status_code=err.status)
        except Exception as exc:  # noqa: BLE001 - a bug of ours answers 500; the server keeps serving
            err = GatewayError(500, f"internal error: {type(exc).__name__}: {exc}"[:500], code="internal_error")
            self._refuse(ep, err)
            return JSONResponse(err.body(), status_code=500)
        if prep.stream:
            return Response(self._sse(payload, prep), media_type="text/event-stream")
        return JSONResponse(payload)

    def _refuse(self, ep: _Episode | None, err: GatewayError) -> None:
        with self._lock:
            self._m.errors += 1
            if ep is not None and ep.open:
                ep.errors.append(f"{err.status} {err.message}")

    def _episode_of(self, header: str | None) -> _Episode:
        key = header[7:].strip() if header and header[:7].lower() == "bearer " else ""
        if not key:
            raise GatewayError(401, "missing API key: send 'Authorization: Bearer KEY' with an episode's key",
                               code="invalid_api_key")
        with self._lock:
            ep = self._episodes.get(key)
        if ep is None:
            raise GatewayError(401, "unknown or closed API key (keys come from Gateway.open_episode)",
                               code="invalid_api_key")
        return ep

    # -- reading a request -----------------------------------------------------------------------------------------
    def _prepare_chat(self, ep: _Episode, body: dict) -> _Prepared:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise GatewayError(400, "'messages' must be a non-empty list", param="messages")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise GatewayError(400, "every message must be an object with a string 'role'", param="messages")
        tools = body.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise GatewayError(400, "'tools' must be a list of objects", param="tools")
        common = self._common(body)
        try:
            text = self.tokenizer.apply_chat_template([_template_message(m) for m in messages], tools=tools or None,
                                                      add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # noqa: BLE001 - a template's raise_exception or a bad message is the request's
            raise GatewayError(400, f"the chat template failed on these messages: {type(exc).__name__}: "
                                    f"{exc}"[:500], param="messages") from None
        if not isinstance(text, str):
            raise GatewayError(500, "the chat template did not render a string", code="internal_error")
        keys, tools_key = tuple(_message_key(m) for m in messages), _canonical(tools or None)
        ids = self._chat_splice(ep, messages, keys, tools, tools_key)
        if ids is None:
            ids = self._prompt_ids(ep, "chat", text, add_special_tokens=False)
        logprobs = bool(body.get("logprobs"))
        parse_tools = bool(tools) and body.get("tool_choice") != "none"
        prep = self._prepared(ep, body, "chat", text, ids, common, logprobs, parse_tools)
        prep.messages, prep.tools = keys, tools_key
        return prep

    def _chat_splice(self, ep: _Episode, messages: list, keys: tuple, tools, tools_key: str) -> list[int] | None:
        """The message splice (module docstring): when the request repeats the conversation of the episode's last
        chat call (its messages and the assistant message answered, read as _message_key reads them, and the same
        tools) and adds messages, the ids are the last call's prompt and sampled ids plus the template's rendering
        of the added messages alone; None otherwise (the text splice or a fresh encoding decides)."""
        last = ep.last.get("chat")
        if last is None or last.messages is None or last.tools != tools_key:
            return None
        n = len(last.messages)
        if len(keys) <= n or keys[:n] != last.messages:
            return None
        after = self._render_after(messages[n:], tools)
        if after is None:
            return None
        end = last.completion_ids[-1] if last.completion_ids else None
        if end is not None and end in self._special_ids:  # the sampled end token stands for the template's copy
            end_text = self.tokenizer.decode([end], skip_special_tokens=False)
            if end_text and after.startswith(end_text):
                after = after[len(end_text):]
        tail = list(self.tokenizer.encode(after, add_special_tokens=False)) if after else []
        return last.prompt_ids + last.completion_ids + tail

    def _render_after(self, added: list, tools) -> str | None:
        """The template's text after an assistant message, up to the next generation prompt, carrying `added`:
        a conversation [user, assistant MARK, *added] rendered and cut after the mark; None when the template
        does not render the mark once."""
        base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK}]
        try:
            rendered = self.tokenizer.apply_chat_template(base + [_template_message(m) for m in added],
                                                          tools=tools or None, add_generation_prompt=True,
                                                          tokenize=False)
        except Exception:  # noqa: BLE001 - a template that refuses this shape: no message splice
            return None
        if not isinstance(rendered, str) or rendered.count(_MARK) != 1:
            return None
        return rendered.split(_MARK, 1)[1]

    def _prepare_completions(self, ep: _Episode, body: dict) -> _Prepared:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if body.get("echo"):
            raise GatewayError(400, "echo is not supported", param="echo")
        if isinstance(prompt, str):
            if not prompt:
                raise GatewayError(400, "the prompt is empty", param="prompt")
            text = prompt
            ids = self._prompt_ids(ep, "completions", text, add_special_tokens=True)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                          for t in prompt):
            vocab = len(self.tokenizer)
            if any(not 0 <= t < vocab for t in prompt):
                raise GatewayError(400, f"token ids must be in [0, {vocab})", param="prompt")
            ids = list(prompt)
            text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        else:
            raise GatewayError(400, "'prompt' must be one non-empty string or one non-empty list of token ids "
                                    "(one prompt per request)", param="prompt")
        common = self._common(body)
        lp = body.get("logprobs")
        return self._prepared(ep, body, "completions", text, ids, common, lp is not None and lp is not False, False)

    def _common(self, body: dict) -> dict:
        """The fields both endpoints share, checked."""
        n = body.get("n", 1)
        if n is not None and n != 1:
            raise GatewayError(400, f"n must be 1, got {n!r} (open one episode per sample)", param="n")
        stop = body.get("stop")
        if stop is None:
            stops: tuple[str, ...] = ()
        elif isinstance(stop, str):
            stops = (stop,) if stop else ()
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            stops = tuple(s for s in stop if s)
        else:
            raise GatewayError(400, "'stop' must be a string or a list of strings", param="stop")
        named = []
        for k in ("max_tokens", "max_completion_tokens"):
            v = body.get(k)
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GatewayError(400, f"'{k}' must be an integer >= 1, got {v!r}", param=k)
            named.append(v)
        stream_options = body.get("stream_options") or {}
        return {"stops": stops, "max_tokens": min(named) if named else None, "stream": bool(body.get("stream")),
                "include_usage": bool(isinstance(stream_options, dict) and stream_options.get("include_usage")),
                "return_token_ids": bool(body.get("return_token_ids"))}

    def _overridden(self, body: dict, spec: SamplingSpec) -> int:
        n = 0
        for k, mine in (("temperature", spec.temperature), ("top_p", spec.top_p), ("top_k", spec.top_k)):
            v = body.get(k)
            if v is not None and not (k == "top_k" and v in (0, -1) and mine in (0, -1)) and v != mine:
                n += 1
        n += sum(body.get(k) is not None and body.get(k) != neutral for k, neutral in _NEUTRAL.items())
        n += bool(body.get("logit_bias"))
        rf = body.get("response_format")
        n += isinstance(rf, dict) and rf.get("type", "text") != "text"
        return n

    def _prompt_ids(self, ep: _Episode, endpoint: str, text: str, *, add_special_tokens: bool) -> list[int]:
        """The splice (module docstring): the last call's ids where the text extends it, else the text encoded."""
        last = ep.last.get(endpoint)
        if last is not None:
            head = last.prompt_text + last.completion_text
            heads = [head] + ([last.prompt_text + last.open_text] if last.open_text is not None else [])
            for h in heads:  # the sampled end token stays in the ids: the model saw it, the trainer scores it
                if text.startswith(h):
                    rest = text[len(h):]
                    tail = list(self.tokenizer.encode(rest, add_special_tokens=False)) if rest else []
                    return last.prompt_ids + last.completion_ids + tail
            with self._lock:
                self._m.prefix_breaks += 1
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _prepared(self, ep: _Episode, body: dict, endpoint: str, text: str, ids: list[int], common: dict,
                  logprobs: bool, parse_tools: bool) -> _Prepared:
        spec = self.spec
        if not ids:
            raise GatewayError(400, "the prompt encodes to no tokens", param="prompt" if endpoint != "chat" else
                               "messages")
        overridden = self._overridden(body, spec)
        if overridden:
            with self._lock:
                self._m.overridden += overridden
        named = common["max_tokens"]
        mt = spec.max_tokens if named is None else min(named, spec.max_tokens)
        with self._lock:
            if ep.max_calls is not None and ep.next_index >= ep.max_calls:
                raise GatewayError(400, f"the episode has made its {ep.max_calls} calls (max_calls)",
                                   code="max_calls_exceeded")
            if ep.max_tokens_total is not None:
                left = ep.max_tokens_total - ep.used_tokens - ep.reserved
                if left <= 0:
                    raise GatewayError(400, f"the episode has used its {ep.max_tokens_total} completion tokens "
                                            "(max_tokens_total)", code="max_tokens_total_exceeded")
                mt = min(mt, left)
        if self.max_context is not None:
            room = self.max_context - len(ids)
            if room <= 0 or (named is not None and mt > room):
                raise GatewayError(400, f"This model's maximum context length is {self.max_context} tokens. However, "
                                        f"you requested {len(ids) + mt} tokens ({len(ids)} in the prompt, {mt} in "
                                        "the completion). Please reduce the length of the messages or completion.",
                                   param="messages" if endpoint == "chat" else "prompt",
                                   code="context_length_exceeded")
            mt = min(mt, room)
        call_spec = replace(spec, n=1, max_tokens=mt, min_tokens=min(spec.min_tokens, mt), seed=None, logprobs=True,
                            stop=tuple(dict.fromkeys((*spec.stop, *common["stops"]))))
        return _Prepared(endpoint, text, ids, call_spec, common["stream"], logprobs, common["include_usage"],
                         common["return_token_ids"], parse_tools)

    def _submit(self, ep: _Episode, prep: _Prepared) -> _Job:
        with self._lock:
            if self._stopping.is_set():
                raise GatewayError(503, "the gateway is shutting down", code="service_unavailable")
            if not ep.open:
                raise GatewayError(401, "the episode was closed", code="invalid_api_key")
            index = ep.next_index
            ep.next_index += 1
            ep.reserved += prep.spec.max_tokens
            job = _Job(ep, prep, index, sequence_seed(ep.seed, index, 0))
            self._queue.put(job)
        return job

    # -- answering -------------------------------------------------------------------------------------------------
    def _answer(self, ep: _Episode, job: _Job, ro, version: int) -> dict:
        prep = job.prep
        ids = list(ro.response_ids)
        if ro.logprobs is None or len(ro.logprobs) != len(ids):
            raise GatewayError(500, "the generator returned no sampler logprobs", code="generation_failed")
        lps = [float(x) for x in ro.logprobs]
        text = ro.text
        finish = ro.finish_reason
        content, tool_calls = text, []
        if prep.parse_tools:
            parsed = self.tool_parser(text)
            if parsed.tool_calls:
                content = parsed.content
                tool_calls = [tc.to_openai(f"call_{job.index}_{k}") for k, tc in enumerate(parsed.tool_calls)]
                finish = "tool_calls"
        record = CallRecord(prompt_ids=list(prep.prompt_ids), completion_ids=ids, logprobs=lps,
                            weight_version=version, finish_reason=finish, text=text, endpoint=prep.endpoint,
                            tool_calls=tool_calls, index=job.index)
        special_text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        open_text = None
        if ids and ids[-1] in self._special_ids:
            open_text = self.tokenizer.decode(ids[:-1], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        answered = None
        if prep.messages is not None:
            reply: dict[str, Any] = {"role": "assistant", "content": content}
            if tool_calls:
                reply["tool_calls"] = tool_calls
            answered = (*prep.messages, _message_key(reply))
        with self._lock:
            ep.used_tokens += len(ids)
            ep.last[prep.endpoint] = _Last(prep.prompt_text, list(prep.prompt_ids), ids, special_text, open_text,
                                           answered, prep.tools)
            if ep.open:
                ep.calls.append(record)
            else:
                self._m.dropped += 1
            self._m.calls += 1
            self._m.prompt_tokens += len(prep.prompt_ids)
            self._m.completion_tokens += len(ids)
        usage = {"prompt_tokens": len(prep.prompt_ids), "completion_tokens": len(ids),
                 "total_tokens": len(prep.prompt_ids) + len(ids)}
        now = int(time.time())
        if prep.endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if tool_calls:
                message["tool_calls"] = tool_calls
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish,
                                      "logprobs": self._chat_logprobs(ids, lps) if prep.logprobs else None}
            payload = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": now,
                       "model": self.model_name, "choices": [choice], "usage": usage}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish,
                      "logprobs": self._completion_logprobs(ids, lps) if prep.logprobs else None}
            payload = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": now,
                       "model": self.model_name, "choices": [choice], "usage": usage}
        if prep.return_token_ids:
            payload["prompt_token_ids"] = list(prep.prompt_ids)
            choice["token_ids"] = list(ids)
        return payload

    def _token_strings(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                for i in ids]

    def _chat_logprobs(self, ids: list[int], lps: list[float]) -> dict:
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
                            for t, lp in zip(self._token_strings(ids), lps, strict=True)]}

    def _completion_logprobs(self, ids: list[int], lps: list[float]) -> dict:
        toks = self._token_strings(ids)
        offsets, pos = [], 0
        for t in toks:
            offsets.append(pos)
            pos += len(t)
        return {"tokens": toks, "token_logprobs": lps, "top_logprobs": [{} for _ in toks], "text_offset": offsets}

    @staticmethod
    def _sse(payload: dict, prep: _Prepared) -> bytes:
        """The whole answer as one server-sent event (plus a usage event when asked), then [DONE]."""
        choice = dict(payload["choices"][0])
        if prep.endpoint == "chat":
            message = choice.pop("message")
            delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
            if "tool_calls" in message:
                delta["tool_calls"] = [{"index": k, **tc} for k, tc in enumerate(message["tool_calls"])]
            choice["delta"] = delta
            kind = "chat.completion.chunk"
        else:
            kind = "text_completion"
        head = {k: v for k, v in payload.items() if k not in ("choices", "usage", "object")}
        events = [{**head, "object": kind, "choices": [choice]}]
        if prep.include_usage:
            events[0]["usage"] = None
            events.append({**head, "object": kind, "choices": [], "usage": payload["usage"]})
        return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"


_MARK = "@@RLVR-GATEWAY-MARK@@"


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _message_key(m: dict) -> tuple:
    """What of a message the splice compares: role, text content ('' for none) and tool calls (name, arguments as
    canonical JSON); ids, names and other fields are not compared."""
    t = _template_message(m)
    calls = []
    for c in t.get("tool_calls") or []:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            calls.append((str(fn.get("name")), _canonical(fn.get("arguments"))))
    return (t.get("role"), t.get("content") if isinstance(t.get("content"), str) else _canonical(t.get("content")),
            tuple(calls))


def _template_message(m: dict) -> dict:
    """An OpenAI message as chat templates expect it: text parts joined into one string, a null content as '',
    and the tool calls' JSON `arguments` strings as objects (what HF templates iterate; vLLM does the same)."""
    out = dict(m)
    content = out.get("content")
    if content is None:
        out["content"] = ""
    elif isinstance(content, list):
        out["content"] = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        fixed = []
        for c in calls:
            if isinstance(c, dict) and isinstance(c.get("function"), dict):
                fn = dict(c["function"])
                if isinstance(fn.get("arguments"), str):
                    try:
                        args = json.loads(fn["arguments"])
                        if isinstance(args, dict):
                            fn["arguments"] = args
                    except ValueError:
                        pass
                c = {**c, "function": fn}
            fixed.append(c)
        out["tool_calls"] = fixed
    return out
