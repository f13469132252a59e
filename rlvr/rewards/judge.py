"""A model judge as a reward: `data.reward=judge` (composable: 'judge:1,format:0.1').

A strict symbolic checker scores some correct free-form answers as wrong ("one half" vs 1/2, "0.5 liters"
vs 0.5); the documents' remedy is a model asked whether two answers are equivalent (Kimi k1.5, verl GenRM,
NeMo-RL GenRM, ROLL's judge server). Here, for each response:

1. the task's symbolic checker runs first (`symbolic`): it extracts the final answer the same way the
   task's own reward does (Reward.answer), and its verdict is the fallback. No answer (a format failure,
   UNPARSABLE) is not sent to the judge: there is nothing to judge.
2. the judge gets the prompt template filled with {question} {reference} {answer} (and {response}, the
   whole response) and must reply with a verdict word: EQUIVALENT or DIFFERENT (the last such word of
   the reply counts; a negated word reads as its opposite: "NOT EQUIVALENT" is DIFFERENT, "not
   different" is EQUIVALENT).
3. total = 1 for EQUIVALENT, else 0 (parts: the symbolic reward's, its "answer" replaced by the verdict).

Batched: `prepare_batch` (called by rlvr.rewards.score_batch before scoring) runs the symbolic checks,
then sends one judge request per distinct prompt not already answered: the HTTP backend (`HTTPJudge`, an
OpenAI-compatible /chat/completions endpoint) with `concurrency` requests in flight, a local model
(rlvr.train.judge, through the generator builder) in one generate call. Verdicts are cached per prompt
(= per (question, answer, reference) under one template) for the life of the reward object (the run).
Never raises: a timeout (judge.timeout_s bounds a whole request), an HTTP error (a redirect is one: never
followed, so the API key never goes to another host), a connection failure, a reply over MAX_REPLY_BYTES or
a reply without a verdict becomes the fallback (`symbolic`: the symbolic checker's reward; `incorrect`: 0;
`unscored`: 0 with Status.ERROR, a sample the trainer keeps out of its group's baseline), with Reward.info
saying why ("judge failed (...)").
Counters (`judge_metrics`): judge/calls, judge/cache_hits, judge/failures, judge/fallbacks,
judge/agree_symbolic (docs/runs.md). Failures are never silent in a run: rlvr.rewards.errors.RewardErrorLog
peeks each step's counts (`JudgeReward.peek`), prints the first failure's reason and stops the run when most
of a step's requests fail (an unreachable judge); `rlvr eval` prints `judge_failure_note`.

This module is torch-free and imports no higher layer: a local-model backend is injected (any object with
`judge(prompts) -> list[JudgeReply]`).
"""

from __future__ import annotations

import contextlib
import contextvars
import http.client
import json
import math
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from rlvr.rewards.extract import final_answer
from rlvr.rewards.grader import verifier_timeout
from rlvr.rewards.types import ExampleLike, Reward, RewardFn, Status
from rlvr.runtime import serialize_ast_parse

DEFAULT_PROMPT = (
    "You are grading a student's final answer to a problem against the reference answer.\n\n"
    "Problem: {question}\n\n"
    "Reference answer: {reference}\n\n"
    "Student's final answer: {answer}\n\n"
    "Are the two answers equivalent: the same value or meaning, whatever the notation, wording, "
    "formatting or units written out (1/2, 0.5 and one half are equivalent)? Judge only the final "
    "answer, not the work. Reply with exactly one word: EQUIVALENT or DIFFERENT."
)
PLACEHOLDERS = ("{question}", "{reference}", "{answer}", "{response}")
FALLBACKS = ("symbolic", "incorrect", "unscored")
FAILED = "judge failed ("  # the start of the info of a reward whose judge request failed (a fallback)
MAX_FIELD_CHARS = 4000  # each filled field is cut to this many characters (a 100k-character response is no prompt)
CACHE_SIZE = 100_000  # verdicts kept per judge (oldest dropped first)
MAX_REASONS = 20  # distinct failure reasons kept per count window

# A verdict word, with an optional negation before it ("not", "no", "isn't", "aren't", then at most one of
# "really" / "actually" / "quite" / "at all"): a negated word reads as its opposite ("not different" is
# EQUIVALENT). A negation must touch the word (spaces, _ or -): "or not. DIFFERENT" is DIFFERENT.
_VERDICT_RE = re.compile(
    r"\b(?:(?P<neg>not|no|isn['’]t|aren['’]t)[\s_-]+(?:(?:really|actually|quite|at\s+all)\s+)?)?"
    r"(?P<word>NON[\s_-]?EQUIVALENT|INEQUIVALENT|EQUIVALENT|DIFFERENT)\b",
    re.IGNORECASE)
_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def prompt_problem(template: str) -> str | None:
    """Why `template` cannot be a judge prompt, or None: it must show the reference ({reference}) and the
    response's answer ({answer} or {response})."""
    missing = []
    if "{reference}" not in template:
        missing.append("{reference}")
    if "{answer}" not in template and "{response}" not in template:
        missing.append("{answer} or {response}")
    if missing:
        return f"the judge prompt must contain {' and '.join(missing)} (placeholders: {', '.join(PLACEHOLDERS)})"
    return None


def fill_prompt(template: str, *, question: str, reference: str, answer: str, response: str) -> str:
    """The template with its placeholders replaced (plain replacement, not str.format: LaTeX braces stay)."""
    values = {"{question}": question, "{reference}": reference, "{answer}": answer, "{response}": response}
    # one pass, so a field that contains a placeholder's text is not replaced again
    pattern = re.compile("|".join(re.escape(k) for k in values))
    return pattern.sub(lambda m: values[m.group(0)][:MAX_FIELD_CHARS], template)


def parse_verdict(text: str | None) -> bool | None:
    """True (EQUIVALENT, not different), False (DIFFERENT, NOT EQUIVALENT, non-equivalent, ...) or None (no
    verdict word). The last verdict of the reply counts (a judge that reasons first ends with its verdict);
    a negation right before a verdict word flips it; a <think> block is skipped."""
    if not text:
        return None
    matches = list(_VERDICT_RE.finditer(_THINK_RE.sub(" ", text)))
    if not matches:
        return None
    last = matches[-1]
    equivalent = last.group("word").upper() == "EQUIVALENT"  # DIFFERENT, NON-EQUIVALENT, INEQUIVALENT: False
    return equivalent != bool(last.group("neg"))


def reward_uses_judge(spec: str) -> bool:
    """Whether a data.reward spec ('judge', 'judge:1,format:0.1') names the judge."""
    if not isinstance(spec, str) or not spec:
        return False
    return any(item.strip().partition(":")[0].strip() == "judge" for item in spec.split(","))


def check_url(url: str) -> str | None:
    """Why `url` cannot be a judge endpoint, or None: http(s)://host[:port][/path]."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https"):
        return f"must start with http:// or https:// (an OpenAI-compatible base such as http://127.0.0.1:8000/v1), " \
               f"got scheme {parsed.scheme or 'none'!r}"
    if not parsed.hostname:
        return "has no host"
    return None


# ------------------------------------------------------------------------------------------- backends


@dataclass(frozen=True)
class JudgeReply:
    """One judge request's outcome: the reply text, or None and why it failed (`error`)."""

    text: str | None
    error: str = ""


class JudgeBackend(Protocol):
    """What the reward needs of a judge: one reply per prompt, in order, never raising."""

    def judge(self, prompts: Sequence[str]) -> list[JudgeReply]: ...


_LOOPBACK = ("localhost", "127.0.0.1", "::1")

MAX_REPLY_BYTES = 1 << 20
"""The most of a reply HTTPJudge reads (1 MiB; a verdict is a short chat completion): a longer one is a
failed request, refused from its Content-Length before its body is read, or cut once past the cap."""


class _Deadline:
    """One request's total deadline (connect + send + every read) and the sockets it opened: `expire`
    (called by the batch thread when the deadline passes) shuts them down, which ends a read or a connect
    blocked in another thread at once. Each socket is kept as a dup of its descriptor, so the shutdown
    reaches it even after TLS wraps (and detaches) the original socket object."""

    def __init__(self, timeout_s: float):
        self.at = time.monotonic() + timeout_s
        self.expired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    def left(self) -> float:
        return self.at - time.monotonic()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            dup = sock.dup()
            self._socks.append(dup)
            if self.expired:
                _shutdown(dup)

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._socks:
                _shutdown(sock)

    def release(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Request(urllib.request.Request):
    """A judge request: carries its _Deadline to the connection the handlers below open."""

    def __init__(self, *args: Any, deadline: _Deadline, **kw: Any):
        super().__init__(*args, **kw)
        self.deadline = deadline


def _watched(http_class: Any, req: urllib.request.Request) -> Any:
    """http_class (http.client.HTTP[S]Connection) whose sockets are watched by the request's deadline."""
    deadline = getattr(req, "deadline", None)
    if deadline is None:
        return http_class

    def make(*args: Any, **kw: Any) -> Any:
        conn = http_class(*args, **kw)
        create = conn._create_connection

        def create_connection(*a: Any, **k: Any) -> socket.socket:
            sock = create(*a, **k)
            deadline.watch(sock)
            return sock

        conn._create_connection = create_connection
        return conn

    return make


class _HTTPHandler(urllib.request.HTTPHandler):
    def do_open(self, http_class, req, **kw):  # noqa: ANN001 - urllib's signature
        return super().do_open(_watched(http_class, req), req, **kw)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def do_open(self, http_class, req, **kw):  # noqa: ANN001
        return super().do_open(_watched(http_class, req), req, **kw)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is never followed: urllib's default resends every header, the API key included, to
    whatever host `Location` names (as a GET, whose reply it would take for the verdict). The 3xx reply
    becomes an HTTPError, a failed request."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001
        return None


def _redacted_location(location: str) -> str:
    """A redirect's target as the failure reason shows it: no user:password@, no query, at most 100 chars."""
    try:
        parts = urllib.parse.urlsplit(location)
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        shown = urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", "")) if parts.scheme else parts.path
    except ValueError:
        shown = ""
    return shown[:100]


class HTTPJudge:
    """An OpenAI-compatible chat endpoint (vLLM `serve`, SGLang, an API): POST {url}/chat/completions, one
    request per prompt, `concurrency` at a time on daemon threads; each bounded by `timeout_s` in total
    (connect, send and every read: at its deadline its socket is shut down, so no thread stays blocked), the
    whole batch by timeout_s per round of `concurrency` requests (+1 s). A redirect is not followed (it is a
    failed request), a reply over MAX_REPLY_BYTES is not read. The key (Authorization: Bearer) is read from
    the environment variable `api_key_env` at each request and never logged."""

    def __init__(self, url: str, model: str, *, max_tokens: int = 16, timeout_s: float = 30.0,
                 concurrency: int = 8, api_key_env: str = ""):
        if (problem := check_url(url)) is not None:
            raise ValueError(f"judge.url={url!r} {problem}")
        self.url = url.rstrip("/") + "/chat/completions"
        self.label = f"judge.url={url}"  # what the messages call this judge
        self.model, self.max_tokens, self.timeout_s = model, int(max_tokens), float(timeout_s)
        self.concurrency, self.api_key_env = max(1, int(concurrency)), api_key_env
        host = urllib.parse.urlsplit(url).hostname or ""
        # a loopback judge bypasses any http_proxy of the environment; others use it as urllib does
        handlers: list[Any] = [_HTTPHandler(), _HTTPSHandler(), _NoRedirects()]
        if host in _LOOPBACK or host.startswith("127."):
            handlers.insert(0, urllib.request.ProxyHandler({}))
        self._opener = urllib.request.build_opener(*handlers)

    def __repr__(self) -> str:  # no key in any repr
        return f"HTTPJudge({self.url!r}, model={self.model!r})"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env, "")
            if key:
                headers["Authorization"] = f"Bearer {key}"
        return headers

    def request_body(self, prompt: str) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "max_tokens": self.max_tokens,
                                "temperature": 0.0}
        if self.model:
            body["model"] = self.model
        return body

    def _timed_out(self) -> JudgeReply:
        return JudgeReply(None, f"timeout after {self.timeout_s:g} s (judge.timeout_s)")

    def _one(self, prompt: str, deadline: _Deadline) -> JudgeReply:
        data = json.dumps(self.request_body(prompt)).encode("utf-8")
        req = _Request(self.url, data=data, headers=self._headers(), method="POST", deadline=deadline)
        try:
            if deadline.left() <= 0:
                return self._timed_out()
            with self._opener.open(req, timeout=deadline.left()) as resp:
                raw = self._read(resp, deadline)
        except urllib.error.HTTPError as exc:
            exc.close()
            if 300 <= exc.code < 400:
                where = _redacted_location(exc.headers.get("Location", "") if exc.headers else "")
                return JudgeReply(None, f"HTTP {exc.code} from the judge: a redirect"
                                        + (f" to {where}" if where else "")
                                        + "; the judge does not follow redirects (set judge.url to the endpoint "
                                          "itself)")
            return JudgeReply(None, f"HTTP {exc.code} from the judge")
        except urllib.error.URLError as exc:
            if deadline.expired or isinstance(exc.reason, TimeoutError):
                return self._timed_out()
            reason = exc.reason
            if isinstance(reason, OSError) and reason.strerror:  # "[Errno 111] Connection refused" -> the words
                reason = reason.strerror
            return JudgeReply(None, f"cannot reach the judge: {reason}"[:200])
        except TimeoutError:
            return self._timed_out()
        except (OSError, ValueError, http.client.HTTPException) as exc:
            if deadline.expired:  # its socket was shut down at the deadline
                return self._timed_out()
            return JudgeReply(None, f"request failed: {type(exc).__name__}: {exc}"[:200])
        if isinstance(raw, JudgeReply):
            return raw
        if deadline.expired:  # a read cut short at the deadline
            return self._timed_out()
        try:
            payload = json.loads(raw)
            content = payload["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return JudgeReply(None, "the reply is not an OpenAI chat completion (no choices[0].message.content)")
        if not isinstance(content, str):
            return JudgeReply(None, "the reply's message content is not text")
        return JudgeReply(content)

    def _read(self, resp: Any, deadline: _Deadline) -> bytes | JudgeReply:
        """The reply's body, at most MAX_REPLY_BYTES (else a failed reply naming the cap), read until the
        request's deadline (else TimeoutError)."""
        cap = f"{MAX_REPLY_BYTES / (1 << 20):g} MiB"
        length = (resp.headers.get("Content-Length") or "").strip()
        if length.isdigit() and int(length) > MAX_REPLY_BYTES:
            return JudgeReply(None, f"the reply is {int(length)} bytes, over the {cap} a judge reply may have "
                                    "(MAX_REPLY_BYTES; a verdict is a short chat completion); not read")
        chunks, total = [], 0
        while True:
            if deadline.left() <= 0:
                raise TimeoutError
            chunk = resp.read1(min(1 << 16, MAX_REPLY_BYTES + 1 - total))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_REPLY_BYTES:
                return JudgeReply(None, f"the reply is over the {cap} a judge reply may have (MAX_REPLY_BYTES; "
                                        "a verdict is a short chat completion); the rest was not read")

    def judge(self, prompts: Sequence[str]) -> list[JudgeReply]:
        """One reply per prompt, in order, within the batch deadline. Requests run on `concurrency` daemon
        threads (never joined at exit); this thread shuts down each request's sockets at its deadline and all
        that are still open when it returns, so every worker ends promptly."""
        n = len(prompts)
        if n == 0:
            return []
        rounds = math.ceil(n / self.concurrency)
        budget = rounds * self.timeout_s + 1.0
        batch_end = time.monotonic() + budget
        replies: list[JudgeReply | None] = [None] * n
        running: dict[int, _Deadline] = {}
        cond = threading.Condition()
        state = {"next": 0, "stop": False}

        def work() -> None:
            while True:
                with cond:
                    if state["stop"] or state["next"] >= n:
                        return
                    i = state["next"]
                    state["next"] += 1
                    deadline = running[i] = _Deadline(self.timeout_s)
                reply = JudgeReply(None, "the request did not finish")
                try:
                    reply = self._safe_one(prompts[i], deadline)
                finally:
                    deadline.release()
                    with cond:
                        running.pop(i, None)
                        if not state["stop"]:
                            replies[i] = reply
                        cond.notify_all()

        for k in range(min(self.concurrency, n)):
            threading.Thread(target=work, name=f"rlvr-judge-{k}", daemon=True).start()
        with cond:
            while True:
                now = time.monotonic()
                for d in running.values():
                    if not d.expired and d.at <= now:
                        d.expire()
                if all(r is not None for r in replies) or now >= batch_end:
                    break
                wake = min([batch_end, *(d.at for d in running.values() if not d.expired)])
                cond.wait(max(wake - now, 0.0) + 0.005)
            state["stop"] = True
            for d in running.values():  # past the batch deadline: end them now
                d.expire()
            out = list(replies)
        return [r if r is not None else JudgeReply(None, f"timeout: the batch ran past {budget:g} s "
                                                         "(judge.timeout_s per round of judge.concurrency)")
                for r in out]

    def _safe_one(self, prompt: str, deadline: _Deadline) -> JudgeReply:
        try:
            return self._one(prompt, deadline)
        except Exception as exc:  # noqa: BLE001 - a judge never raises into the trainer
            if deadline.expired:
                return self._timed_out()
            return JudgeReply(None, f"{type(exc).__name__}: {exc}"[:200])


# --------------------------------------------------------------------------------------------- reward


@dataclass
class JudgeCounts:
    """Counts since the last `take` (one training step, one evaluation)."""

    calls: int = 0  # judge requests sent (distinct prompts not cached)
    cache_hits: int = 0  # judged samples whose verdict came from the cache (no request)
    failures: int = 0  # requests without a verdict (timeout, HTTP error, connection, no verdict word)
    fallbacks: int = 0  # samples scored by judge.fallback because their request failed
    judged: int = 0  # samples with a verdict
    agree: int = 0  # ... of which the symbolic checker gave the same verdict
    reasons: dict[str, int] = field(default_factory=dict)  # why requests failed: {reason: count} (not a metric)

    def top_reason(self) -> str:
        """The most frequent failure reason ('' without a failure)."""
        return max(self.reasons.items(), key=lambda kv: kv[1])[0] if self.reasons else ""

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = {"judge/calls": self.calls, "judge/cache_hits": self.cache_hits,
                               "judge/failures": self.failures, "judge/fallbacks": self.fallbacks}
        if self.judged:
            m["judge/agree_symbolic"] = self.agree / self.judged
        return m


class JudgeReward:
    """The judge reward (see the module docstring). backend: a JudgeBackend, or None for the registry's
    unconfigured `judge` (every call an ERROR naming the keys to set). symbolic: the task's own checker
    (extraction and fallback). prompt: the template ('' = DEFAULT_PROMPT). fallback: symbolic | incorrect |
    unscored (FALLBACKS)."""

    def __init__(self, backend: JudgeBackend | None = None, symbolic: RewardFn | None = None, *, prompt: str = "",
                 fallback: str = "symbolic", cache_size: int = CACHE_SIZE):
        from rlvr.rewards.functions import math as math_reward  # the generic extraction + tiered checker

        self.backend = backend
        self.symbolic = symbolic if symbolic is not None else math_reward
        self.prompt = prompt or DEFAULT_PROMPT
        if (problem := prompt_problem(self.prompt)) is not None:
            raise ValueError(f"judge.prompt: {problem}")
        if fallback not in FALLBACKS:
            raise ValueError(f"judge.fallback={fallback!r} is unknown; known: {', '.join(FALLBACKS)}")
        self.fallback, self.cache_size = fallback, int(cache_size)
        self.cache: dict[str, bool] = {}
        self.counts = JudgeCounts()
        self._lock = threading.Lock()
        self._memo: dict[tuple[str, int], tuple[Any, Reward]] = {}
        self.__name__ = "judge"

    def __repr__(self) -> str:
        return f"JudgeReward({self.backend!r}, fallback={self.fallback!r})"

    def __reduce__(self):
        # the registry's unconfigured judge pickles by name (registered rewards are picklable: score_batch's
        # isolate mode); a configured one as its settings with an empty cache (when its backend pickles)
        if self is UNCONFIGURED_JUDGE:
            return "UNCONFIGURED_JUDGE"
        return (_rebuild_judge, (self.backend, self.symbolic, self.prompt, self.fallback, self.cache_size))

    def __call__(self, response: str, example: ExampleLike) -> Reward:
        hit = self._memo.get((response, id(example)))
        if hit is not None and hit[0] is example:
            return hit[1]
        return self.score_many([response], [example])[0]

    def prepare_batch(self, responses: Sequence[str], examples: Sequence[ExampleLike], *, workers: int = 1,
                      timeout_s: float | None = None) -> None:
        """Score a whole batch at once (symbolic checks on `workers` threads under `timeout_s` each, then
        the judge requests together); the per-sample calls that follow return these rewards."""
        rewards = self.score_many(responses, examples, workers=workers, timeout_s=timeout_s)
        self._memo = {(r, id(e)): (e, w) for r, e, w in zip(responses, examples, rewards, strict=True)}

    @property
    def label(self) -> str:
        """What messages call this judge: "judge.url=..." or "judge.model=..." (the backend's `label`)."""
        return str(getattr(self.backend, "label", "") or repr(self.backend))

    def peek(self) -> JudgeCounts:
        """A copy of the counts since the last take_metrics (the current step's), without resetting them."""
        with self._lock:
            return replace(self.counts, reasons=dict(self.counts.reasons))

    def take_metrics(self) -> dict[str, float]:
        """The judge/* counts since the last call, and reset them."""
        with self._lock:
            counts, self.counts = self.counts, JudgeCounts()
        return counts.metrics()

    # ----------------------------------------------------------------------------------------- scoring

    def _symbolic(self, response: str, example: ExampleLike) -> Reward:
        try:
            out = self.symbolic(response, example)
            if isinstance(out, Reward):
                return out
            return Reward(0.0, {}, Status.ERROR, f"symbolic checker returned {type(out).__name__}, not Reward")
        except Exception as exc:  # noqa: BLE001 - never raise into the trainer
            return Reward(0.0, {}, Status.ERROR, f"symbolic checker: {type(exc).__name__}: {exc}"[:300])

    def score_many(self, responses: Sequence[str], examples: Sequence[ExampleLike], *, workers: int = 1,
                   timeout_s: float | None = None) -> list[Reward]:
        """The rewards of a batch, in order; never raises."""
        try:
            return self._score_many(responses, examples, workers, timeout_s)
        except Exception as exc:  # noqa: BLE001 - a bug here must not stop a run; counted as errors
            return [Reward(0.0, {}, Status.ERROR, f"judge: {type(exc).__name__}: {exc}"[:300]) for _ in responses]

    def _score_many(self, responses, examples, workers, timeout_s) -> list[Reward]:
        n = len(responses)
        if self.backend is None:
            return [Reward(0.0, {}, Status.ERROR, "the judge is not configured: set judge.url (an OpenAI-compatible "
                                                  "endpoint) or judge.model (a local judge model)")] * n

        def symbolic(i: int) -> Reward:
            if timeout_s is None:
                return self._symbolic(responses[i], examples[i])
            with verifier_timeout(timeout_s):
                return self._symbolic(responses[i], examples[i])

        if workers > 1 and n > 1:
            serialize_ast_parse()  # (a CPython race between threads in ast.parse: rlvr.runtime)
            # each thread runs in a copy of the caller's context: a tolerance wrapper's setting holds there too
            contexts = [contextvars.copy_context() for _ in range(n)]
            with ThreadPoolExecutor(max_workers=min(workers, n), thread_name_prefix="rlvr-judge-sym") as ex:
                sym = list(ex.map(lambda i: contexts[i].run(symbolic, i), range(n)))
        else:
            sym = [symbolic(i) for i in range(n)]

        prompts: list[str | None] = []
        answers: list[str | None] = []
        for i in range(n):
            s = sym[i]
            if s.status in (Status.UNPARSABLE, Status.ERROR, Status.TIMEOUT) and s.answer is None:
                prompts.append(None)  # nothing to judge (no answer), or the checker itself failed: its reward
                answers.append(None)
                continue
            answer = s.answer if s.answer is not None else final_answer(responses[i])
            if answer is None:
                prompts.append(None)
                answers.append(None)
                continue
            ex = examples[i]
            prompts.append(fill_prompt(self.prompt, question=str(getattr(ex, "question", "") or ""),
                                       reference=str(ex.reference), answer=str(answer), response=responses[i]))
            answers.append(str(answer))

        # distinct prompts not cached -> one request each
        verdicts: dict[str, bool] = {}
        errors: dict[str, str] = {}
        to_ask: list[str] = []
        asked: set[str] = set()
        hits = 0
        with self._lock:
            for p in prompts:
                if p is None:
                    continue
                if p in self.cache:
                    verdicts[p] = self.cache[p]
                    hits += 1
                elif p in asked:
                    hits += 1  # one request for the batch's copies
                else:
                    to_ask.append(p)
                    asked.add(p)
        replies = self.backend.judge(to_ask) if to_ask else []
        if len(replies) != len(to_ask):
            replies = [JudgeReply(None, f"the judge backend returned {len(replies)} replies for {len(to_ask)} "
                                        "prompts")] * len(to_ask)
        failures = 0
        reasons: dict[str, int] = {}
        for p, reply in zip(to_ask, replies, strict=True):
            v = parse_verdict(reply.text) if reply.text is not None else None
            if v is None:
                failures += 1
                errors[p] = reply.error or f"no verdict word (EQUIVALENT / DIFFERENT) in the reply {reply.text[:80]!r}"
                # one reason per kind: a reply's own text is not part of it
                kind = errors[p] if reply.error else "no verdict word (EQUIVALENT / DIFFERENT) in the reply"
                reasons[kind] = reasons.get(kind, 0) + 1
            else:
                verdicts[p] = v
        with self._lock:
            for p in to_ask:
                if p in verdicts:
                    if len(self.cache) >= self.cache_size:
                        self.cache.pop(next(iter(self.cache)))
                    self.cache[p] = verdicts[p]

        out: list[Reward] = []
        fallbacks = judged = agree = 0
        for i in range(n):
            s, p = sym[i], prompts[i]
            if p is None:
                out.append(s)
                continue
            if p in verdicts:
                v = verdicts[p]
                judged += 1
                agree += v == (s.status is Status.CORRECT)
                score = 1.0 if v else 0.0
                parts = {**s.parts, "answer": score}
                info = f"judge: {'EQUIVALENT' if v else 'DIFFERENT'} (symbolic: {s.status.value})"
                out.append(replace(s, total=score, parts=parts, status=Status.CORRECT if v else Status.INCORRECT,
                                   info=info, answer=answers[i]))
            else:
                fallbacks += 1
                why = errors.get(p, "no verdict")
                if self.fallback == "symbolic":
                    out.append(replace(s, info=f"{FAILED}{why}); symbolic checker: {s.info}"[:500]))
                elif self.fallback == "unscored":  # an error: out of its group's baseline, advantage 0
                    parts = {**s.parts, "answer": 0.0} if s.parts else {"answer": 0.0}
                    out.append(Reward(0.0, parts, Status.ERROR, f"{FAILED}{why}); unscored "
                                      "(judge.fallback=unscored)"[:500], answer=answers[i]))
                else:
                    parts = {**s.parts, "answer": 0.0} if s.parts else {"answer": 0.0}
                    out.append(Reward(0.0, parts, Status.INCORRECT, f"{FAILED}{why}); scored incorrect "
                                      "(judge.fallback=incorrect)"[:500], answer=answers[i]))
        with self._lock:
            c = self.counts
            c.calls += len(to_ask)
            c.cache_hits += hits
            c.failures += failures
            c.fallbacks += fallbacks
            c.judged += judged
            c.agree += agree
            for kind, k in reasons.items():
                if kind in c.reasons or len(c.reasons) < MAX_REASONS:
                    c.reasons[kind] = c.reasons.get(kind, 0) + k
        return out


def _rebuild_judge(backend, symbolic, prompt, fallback, cache_size) -> JudgeReward:
    return JudgeReward(backend, symbolic, prompt=prompt, fallback=fallback, cache_size=cache_size)


UNCONFIGURED_JUDGE = JudgeReward()  # the registry's `judge`: an ERROR until a run binds a configured one


def find_judge(fn: Any) -> JudgeReward | None:
    """The JudgeReward inside a reward function (itself, a composition's bound term, a tolerance wrapper)."""
    seen = 0
    while fn is not None and seen < 8:
        seen += 1
        if isinstance(fn, JudgeReward):
            return fn if fn.backend is not None else None
        bound = dict(getattr(fn, "bound", ()) or ())
        if "judge" in bound:
            fn = bound["judge"]
            continue
        fn = getattr(fn, "fn", None)
    return None


def judge_metrics(fn: Any) -> dict[str, float]:
    """judge/* counts of the judge inside reward function `fn` since the last call (reset); {} without one."""
    judge = find_judge(fn)
    return judge.take_metrics() if judge is not None else {}


def judge_failure_note(fn: Any) -> str | None:
    """One line about the failed requests of the judge inside reward function `fn` since the last take
    (peeked, not reset): how many, its label, the most frequent reason and what scored those samples; None
    without a judge or a failure (`rlvr eval` prints it: an unreachable judge is not silent)."""
    judge = find_judge(fn)
    if judge is None:
        return None
    c = judge.peek()
    if not c.failures:
        return None
    return (f"warning: {c.failures} of {c.calls} judge requests failed ({judge.label}): {c.top_reason()}; "
            f"{c.fallbacks} responses were scored by judge.fallback={judge.fallback}, not by the judge")
