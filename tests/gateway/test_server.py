"""rlvr.gateway.server: the OpenAI-compatible gateway, driven by the official `openai` client (the agent
functions import nothing of rlvr). Multi-turn token-in/token-out against the tiny model (the trained ids are
exactly the sampled ids), tool calls through a scripted generator, batching of concurrent episodes, the error
answers, the episode budgets, and shutdown with requests pending."""

from __future__ import annotations

import json
import threading
import time

import pytest
from helpers.gateway import Scripted, Spy, chatml_tokenizer, tiny_chat_policy

from rlvr.gateway.server import Gateway
from rlvr.models.tiny import build_char_tokenizer
from rlvr.rollout import HFGenerator, SamplingSpec

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")  # comes with openai

SPEC = SamplingSpec(temperature=1.0, max_tokens=12)
SCRIPTED_SPEC = SamplingSpec(temperature=1.0, max_tokens=100)


@pytest.fixture(scope="module")
def tiny():
    return tiny_chat_policy()


@pytest.fixture(scope="module")
def served(tiny):
    model, tok = tiny
    spy = Spy(HFGenerator(model, tok, batch_size=16))
    with Gateway(spy, tok, SPEC, batch_wait_s=0.02, max_context=512) as gw:
        yield gw, spy, tok


@pytest.fixture(scope="module")
def scripted():
    tok = chatml_tokenizer(build_char_tokenizer(special_tokens=("<|im_end|>",)))
    gen = Scripted(tok, ["unused"])
    with Gateway(gen, tok, SCRIPTED_SPEC) as gw:
        yield gw, gen, tok


def client(gw, key):
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


# -- agent programs: plain OpenAI-client code --------------------------------------------------------------------
def tool_agent(base_url: str, key: str, user: str, rewrite: str | None = None):
    """Two chat calls: system + user; then the assistant's answer and a tool result (with the user turn rewritten
    when `rewrite` is given). Returns the two message lists sent and the two responses."""
    from openai import OpenAI

    c = OpenAI(base_url=base_url, api_key=key, max_retries=0)
    first = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": user}]
    r1 = c.chat.completions.create(model="policy", messages=first, max_tokens=10)
    second = [*first, {"role": "assistant", "content": r1.choices[0].message.content},
              {"role": "tool", "content": "42", "tool_call_id": "t1"}]
    if rewrite is not None:
        second[1] = {"role": "user", "content": rewrite}
    r2 = c.chat.completions.create(model="policy", messages=second, max_tokens=10)
    return (first, second), (r1, r2)


def sampled(spy, start: int):
    return spy.rollouts[start:]


# -- multi-turn token-in/token-out -------------------------------------------------------------------------------
def test_multi_turn_episode_trains_on_exactly_the_sampled_ids(served):
    gw, spy, tok = served
    spy.gen.weight_version = 5
    key = gw.open_episode("calc#0", seed=11)
    start = len(spy.rollouts)
    (first, second), (r1, r2) = tool_agent(gw.base_url, key, "What is 6*7?")
    rec = gw.close_episode(key)
    ro1, ro2 = sampled(spy, start)
    assert [c.completion_ids for c in rec.calls] == [ro1.response_ids, ro2.response_ids]
    assert r1.choices[0].message.content == ro1.text and rec.calls[1].text == ro2.text == rec.last_text
    assert [c.weight_version for c in rec.calls] == [5, 5] and rec.errors == []
    (seg,) = rec.segments()
    # the first prompt is the rendered chat, encoded once
    rendered1 = tok.apply_chat_template(first, add_generation_prompt=True, tokenize=False)
    assert seg.prompt_ids == tok.encode(rendered1, add_special_tokens=False) == ro1.prompt_ids
    # the trained ids are exactly the sampled ids, with the sampler's logprobs
    mask = seg.loss_mask
    assert [i for i, m in zip(seg.response_ids, mask, strict=True) if m] == ro1.response_ids + ro2.response_ids
    assert [lp for lp, m in zip(seg.logprobs, mask, strict=True) if m] == ro1.logprobs + ro2.logprobs
    assert seg.weight_versions == [5, 5] and seg.calls == 2
    # in between: the template's glue and the tool result, out of the loss
    n1, n2 = len(ro1.response_ids), len(ro2.response_ids)
    glue = seg.response_ids[n1: len(seg.response_ids) - n2]
    assert mask == [True] * n1 + [False] * len(glue) + [True] * n2
    assert all(lp == 0.0 for lp in seg.logprobs[n1: n1 + len(glue)])
    glue_text = tok.decode(glue, skip_special_tokens=False)
    assert glue_text.endswith("<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
    # the second prompt is the first's ids + the sampled ids + the glue: never the sampled text re-tokenized
    assert ro2.prompt_ids == ro1.prompt_ids + ro1.response_ids + glue
    spy.gen.weight_version = 0


def test_a_rewritten_history_gives_two_segments(served):
    gw, spy, tok = served
    gw.metrics()
    key = gw.open_episode("calc#1", seed=12)
    start = len(spy.rollouts)
    (_, second), _ = tool_agent(gw.base_url, key, "What is 6*7?", rewrite="What is 6*8?")
    rec = gw.close_episode(key)
    ro1, ro2 = sampled(spy, start)
    segs = rec.segments()
    assert len(segs) == 2 and [s.calls for s in segs] == [1, 1]
    rendered2 = tok.apply_chat_template(second, add_generation_prompt=True, tokenize=False)
    assert segs[1].prompt_ids == tok.encode(rendered2, add_special_tokens=False)
    assert segs[1].response_ids == ro2.response_ids and all(segs[1].loss_mask)
    assert gw.metrics()["gateway/prefix_breaks"] == 1.0


def test_an_episode_replays_from_its_seed(served):
    gw, spy, _ = served
    ids = []
    for _ in range(2):
        key = gw.open_episode("again", seed=99)
        tool_agent(gw.base_url, key, "Same question?")
        ids.append([c.completion_ids for c in gw.close_episode(key).calls])
    assert ids[0] == ids[1] and ids[0][0] != ids[0][1]


# -- completions, logprobs, streaming ----------------------------------------------------------------------------
def test_completions_text_and_token_in_with_logprobs(served):
    gw, spy, tok = served
    key = gw.open_episode("cmpl", seed=3)
    c = client(gw, key)
    start = len(spy.rollouts)
    r = c.completions.create(model="policy", prompt="12+3=", logprobs=0, max_tokens=6)
    ids = tok.encode("7*8=", add_special_tokens=False)
    r_ids = c.completions.create(model="policy", prompt=ids, max_tokens=4,
                                 extra_body={"return_token_ids": True})
    rec = gw.close_episode(key)
    ro, ro_ids = sampled(spy, start)
    assert r.choices[0].text == ro.text and r.choices[0].logprobs.token_logprobs == ro.logprobs
    assert "".join(r.choices[0].logprobs.tokens) == tok.decode(ro.response_ids, skip_special_tokens=False)
    assert rec.calls[0].prompt_ids == tok.encode("12+3=") and rec.calls[0].endpoint == "completions"
    assert rec.calls[1].prompt_ids == ids == ro_ids.prompt_ids
    assert r_ids.model_extra["prompt_token_ids"] == ids
    assert r_ids.choices[0].model_extra["token_ids"] == ro_ids.response_ids
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == len(ro.response_ids) <= 6


def test_chat_logprobs_and_streaming_in_one_chunk(served):
    gw, spy, tok = served
    key = gw.open_episode("stream", seed=4)
    c = client(gw, key)
    start = len(spy.rollouts)
    msgs = [{"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model="policy", messages=msgs, logprobs=True, top_logprobs=0)
    chunks = list(c.chat.completions.create(model="policy", messages=msgs, stream=True,
                                            stream_options={"include_usage": True}))
    text_chunks = list(c.completions.create(model="policy", prompt="ab", stream=True))
    rec = gw.close_episode(key)
    ro, ro_s, ro_c = sampled(spy, start)
    content = r.choices[0].logprobs.content
    assert [t.logprob for t in content] == ro.logprobs and all(t.top_logprobs == [] for t in content)
    assert [t.token for t in content] == [tok.decode([i], skip_special_tokens=False) for i in ro.response_ids]
    assert len(chunks) == 2 and chunks[0].choices[0].delta.content == ro_s.text
    assert chunks[0].choices[0].finish_reason == rec.calls[1].finish_reason and chunks[1].usage.completion_tokens
    assert len(text_chunks) == 1 and text_chunks[0].choices[0].text == ro_c.text
    assert len(rec.calls) == 3


def test_models_lists_the_policy(served):
    gw, _, _ = served
    models = openai.OpenAI(base_url=gw.base_url, api_key="any", max_retries=0).models.list()
    assert [m.id for m in models.data] == ["policy"]


# -- concurrency ---------------------------------------------------------------------------------------------------
def test_concurrent_episodes_are_batched_and_kept_apart(served):
    gw, spy, tok = served
    gw.metrics()
    keys = [gw.open_episode(f"agent#{i}", seed=100 + i) for i in range(8)]
    barrier = threading.Barrier(8)
    errors = []

    def run(i):
        try:
            barrier.wait(10)
            tool_agent(gw.base_url, keys[i], f"agent {i} asks")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    m = gw.metrics()
    assert m["gateway/calls"] == 16 and m["gateway/batch_size_mean"] > 1 and m["gateway/overhead_s_mean"] >= 0
    for i, key in enumerate(keys):
        rec = gw.close_episode(key)
        assert len(rec.calls) == 2 and rec.name == f"agent#{i}"
        for c in rec.calls:
            prompt = tok.decode(c.prompt_ids, skip_special_tokens=False)
            assert f"agent {i} asks" in prompt
            assert [j for j in range(8) if f"agent {j} asks" in prompt] == [i]
        assert len(rec.segments()) == 1


# -- errors ----------------------------------------------------------------------------------------------------------
def error_of(exc_info) -> dict:
    body = exc_info.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(served):
    gw, _, tok = served
    gw.metrics()
    with pytest.raises(openai.AuthenticationError) as e:
        client(gw, "not-a-key").chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    assert error_of(e)["code"] == "invalid_api_key"
    assert httpx.post(f"{gw.base_url}/completions", json={"prompt": "x"}).status_code == 401  # no header
    for r, status in ((httpx.get(f"{gw.base_url}/chat/completions"), 405), (httpx.post(f"{gw.base_url}/nope"), 404)):
        assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}
    key = gw.open_episode("bad", seed=0)
    c = client(gw, key)
    r = httpx.post(f"{gw.base_url}/chat/completions", content=b"{not json",
                   headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="policy", messages=[])
    assert error_of(e)["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], n=2)
    assert error_of(e)["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="policy", prompt=[[1, 2], [3, 4]])
    long = "y" * 505  # 505 characters = 505 tokens, + the template's, + max_tokens: over max_context=512
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="policy", messages=[{"role": "user", "content": long}], max_tokens=5)
    assert error_of(e)["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="policy", prompt="z" * 600)
    assert error_of(e)["code"] == "context_length_exceeded"
    # a prompt with room for fewer tokens than spec.max_tokens, no max_tokens named: cut to the room left
    ok = c.completions.create(model="policy", prompt="w" * 506)
    assert ok.usage.completion_tokens <= 6
    ok = c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "still here?"}])
    assert ok.choices[0].message.role == "assistant"
    rec = gw.close_episode(key)
    assert len(rec.calls) == 2 and len(rec.errors) == 6
    assert rec.errors[0].startswith("400 the request body is not JSON")
    assert all(e.startswith("400 ") for e in rec.errors)
    with pytest.raises(openai.AuthenticationError):  # closed
        c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(KeyError):
        gw.close_episode(key)
    assert gw.metrics()["gateway/errors"] == 9


def test_default_context_is_the_models_positions(tiny):
    model, tok = tiny
    assert Gateway(HFGenerator(model, tok), tok, SPEC).max_context == model.config.max_position_embeddings


# -- tool calls, sampling settings, budgets (scripted generator) ---------------------------------------------------
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def test_tool_calls_parsed_end_to_end_and_the_call_round_trips_into_one_segment(scripted):
    gw, gen, tok = scripted
    gen.turns, gen.n = [CALL, "The sum is 3."], 0
    key = gw.open_episode("tools", seed=1)
    c = client(gw, key)
    msgs = [{"role": "user", "content": "1+2?"}]
    r1 = c.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, max_tokens=100)
    ch = r1.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    tc = ch.message.tool_calls[0]
    assert tc.type == "function" and tc.function.name == "add" and json.loads(tc.function.arguments) == {"a": 1, "b": 2}
    msgs += [ch.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": tc.id, "content": "3"}]
    r2 = c.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, max_tokens=100)
    assert r2.choices[0].message.content == "The sum is 3." and r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.tool_calls is None
    rec = gw.close_episode(key)
    assert rec.calls[0].finish_reason == "tool_calls" and rec.calls[0].tool_calls[0]["function"]["name"] == "add"
    assert rec.calls[0].text == CALL  # the markup is kept in the record
    (seg,) = rec.segments()  # the template re-renders the call exactly as the model wrote it
    assert seg.calls == 2 and seg.weight_versions == [3, 3] and seg.finish_reason == "stop"


def test_tools_in_a_stream_and_tool_choice_none(scripted):
    gw, gen, _ = scripted
    gen.turns, gen.n = [CALL], 0
    key = gw.open_episode("tools-stream", seed=1)
    c = client(gw, key)
    msgs = [{"role": "user", "content": "1+2?"}]
    (chunk,) = list(c.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, stream=True))
    assert chunk.choices[0].delta.tool_calls[0].function.name == "add"
    r = c.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.content == CALL and r.choices[0].finish_reason == "stop"
    gw.close_episode(key)


def test_the_runs_sampling_wins_and_request_stops_join_the_specs(scripted):
    gw, gen, _ = scripted
    gen.turns, gen.n = ["hello"], 0
    gw.spec = SamplingSpec(temperature=0.7, top_p=0.9, top_k=20, max_tokens=12, stop=("</a>",))
    try:
        gw.metrics()
        key = gw.open_episode("knobs", seed=1)
        start = len(gen.specs)
        client(gw, key).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}], temperature=0.2, top_p=0.9,
            stop=["END"], max_completion_tokens=50, extra_body={"top_k": 5, "seed": 4})
        (spec,) = gen.specs[start:]
        assert (spec.temperature, spec.top_p, spec.top_k, spec.n) == (0.7, 0.9, 20, 1)
        assert spec.stop == ("</a>", "END") and spec.max_tokens == 12 and spec.logprobs
        assert gw.metrics()["gateway/overridden_params"] == 2  # temperature and top_k; top_p agreed
        gw.close_episode(key)
    finally:
        gw.spec = SCRIPTED_SPEC


def test_episode_budgets_cut_then_refuse(scripted):
    gw, gen, _ = scripted
    gen.turns, gen.n = ["abcdefghijklmnopqrstuvwxyz"], 0
    key = gw.open_episode("budget", seed=1, max_tokens_total=20, max_calls=5)
    c = client(gw, key)
    msgs = [{"role": "user", "content": "x"}]
    r1 = c.chat.completions.create(model="policy", messages=msgs, max_tokens=12)
    r2 = c.chat.completions.create(model="policy", messages=msgs, max_tokens=12)
    assert (r1.usage.completion_tokens, r2.usage.completion_tokens) == (12, 8)
    assert r2.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="policy", messages=msgs)
    assert error_of(e)["code"] == "max_tokens_total_exceeded"
    rec = gw.close_episode(key)
    assert len(rec.calls) == 2 and rec.errors[0].startswith("400 the episode has used its 20")
    key = gw.open_episode("calls", seed=1, max_calls=1)
    c = client(gw, key)
    c.chat.completions.create(model="policy", messages=msgs)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="policy", messages=msgs)
    assert error_of(e)["code"] == "max_calls_exceeded"
    gw.close_episode(key)


def test_completions_splice_the_agents_own_continuation(scripted):
    gw, gen, tok = scripted
    gen.turns, gen.n = [" four", " five"], 0
    key = gw.open_episode("cmpl-splice", seed=1)
    c = client(gw, key)
    r1 = c.completions.create(model="policy", prompt="one two three")
    c.completions.create(model="policy", prompt="one two three" + r1.choices[0].text + "<|im_end|>\nnext:")
    (seg,) = gw.close_episode(key).segments()
    assert tok.decode(seg.response_ids, skip_special_tokens=False) == " four<|im_end|>\nnext: five<|im_end|>"


def _two_chat_turns(tok, turns: list[str], question: str, added: list[dict]):
    """One episode of two chat calls on a scripted generator writing `turns`: the question, then the reply as the
    client returned it and `added`. (its record, gateway/prefix_breaks)."""
    with Gateway(Scripted(tok, turns), tok, SCRIPTED_SPEC) as gw:
        key = gw.open_episode("two-turns", seed=0)
        c = client(gw, key)
        msgs = [{"role": "user", "content": question}]
        r = c.chat.completions.create(model="policy", messages=msgs)
        msgs += [r.choices[0].message.model_dump(exclude_none=True), *added]
        c.chat.completions.create(model="policy", messages=msgs)
        return gw.close_episode(key), gw.metrics()["gateway/prefix_breaks"]


def test_an_end_token_the_template_does_not_write_back_stays_one_segment():
    """The tiny template ends a turn with a newline, not with the EOS the model sampled: the sampled EOS stays in
    the ids (the model saw it), the next prompt extends them, one segment (it was a prefix break)."""
    tok = build_char_tokenizer()  # TINY_CHAT_TEMPLATE: <|role|>content\n, EOS <eos> never rendered
    rec, breaks = _two_chat_turns(tok, ["hi", "yo"], "q", [{"role": "tool", "content": "42"}])
    assert breaks == 0.0
    (seg,) = rec.segments()
    assert tok.decode(seg.response_ids, skip_special_tokens=False) == "hi<eos>\n<|tool|>42\n<|assistant|>yo<eos>"
    assert [tok.decode([i]) for i, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m] == [
        "h", "i", "<eos>", "y", "o", "<eos>"]


def test_a_failed_generation_is_a_500_in_the_record(scripted):
    gw, gen, _ = scripted
    gen.turns, gen.n = ["ok"], 0
    key = gw.open_episode("fail", seed=1)
    c = client(gw, key)
    gen.fail = True
    try:
        with pytest.raises(openai.InternalServerError) as e:
            c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        assert error_of(e)["code"] == "generation_failed"
    finally:
        gen.fail = False
    assert c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}]).choices
    rec = gw.close_episode(key)
    assert rec.errors == ["500 generation failed: RuntimeError: the engine fell over"] and len(rec.calls) == 1


# -- shutdown ------------------------------------------------------------------------------------------------------
def test_stop_answers_pending_requests_503_within_seconds():
    tok = chatml_tokenizer(build_char_tokenizer(special_tokens=("<|im_end|>",)))
    gen = Scripted(tok, ["slow"])
    gen.block = threading.Event()
    gw = Gateway(gen, tok, SPEC, batch_wait_s=0.0).start()
    key = gw.open_episode("slow", seed=0)
    statuses = []

    def post():
        r = httpx.post(f"{gw.base_url}/chat/completions", timeout=30, headers={"Authorization": f"Bearer {key}"},
                       json={"model": "policy", "messages": [{"role": "user", "content": "x"}]})
        statuses.append(r.status_code)

    threads = [threading.Thread(target=post) for _ in range(2)]
    threads[0].start()
    assert gen.entered.wait(10)  # the first is in generate(), the second waits in the queue
    threads[1].start()
    time.sleep(0.2)
    t0 = time.monotonic()
    gw.stop()
    took = time.monotonic() - t0
    for t in threads:
        t.join(10)
    gen.block.set()
    assert statuses == [503, 503] and took < 10  # stop() does not wait on the generate() in flight (a generous bound)
    rec = gw.close_episode(key)
    assert rec.calls == [] and rec.errors == ["503 the gateway is shutting down"] * 2
    with pytest.raises(httpx.HTTPError):
        httpx.post(f"{gw.base_url}/completions", json={"prompt": "x"}, timeout=2)


def test_connections_are_served_without_nagles_delay(scripted):
    """Every accepted connection has TCP_NODELAY: without it (a listening socket of proto 0, which asyncio does not
    treat as TCP) each response waited ~40 ms for the client's delayed ACK, 44 ms per call instead of ~2 ms."""
    import socket

    gw, _, _ = scripted
    with httpx.Client() as c:  # keep-alive: the connection is still open when it is inspected
        assert c.get(gw.base_url + "/models").status_code == 200
        conns = list(gw._server.server_state.connections)
        socks = [p.transport.get_extra_info("socket") for p in conns]
        assert socks and all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in socks)


def test_a_template_that_rewrites_history_keeps_one_sequence():
    """A template that writes assistant history differently from what was sampled (here, as Qwen3's does, without
    the reasoning) would break the text splice on every turn. The message splice renders only the added messages:
    one segment, and the second call's context holds the model's own reasoning tokens as sampled."""
    from helpers.gateway import CHATML

    tok = chatml_tokenizer(build_char_tokenizer(special_tokens=("<|im_end|>",)))
    tok.chat_template = CHATML.replace("{{ m['content'] }}", "{{ m['content'].split('</think>')[-1] }}")
    rec, breaks = _two_chat_turns(tok, ["<think>3 and 4</think>7", "done"], "3+4?",
                                  [{"role": "user", "content": "sure?"}])
    assert breaks == 0.0
    (seg,) = rec.segments()
    assert tok.decode(seg.response_ids, skip_special_tokens=False) == (
        "<think>3 and 4</think>7<|im_end|>\n<|im_start|>user\nsure?<|im_end|>\n<|im_start|>assistant\ndone<|im_end|>")
    assert rec.calls[1].prompt_ids == rec.calls[0].prompt_ids + rec.calls[0].completion_ids + tok.encode(
        "\n<|im_start|>user\nsure?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
