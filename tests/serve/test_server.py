"""`dlmkit serve` end to end: a real server on localhost, the official openai client."""

from __future__ import annotations

import concurrent.futures
import json
import threading

import openai
import pytest

from dlmkit.generate import generate, load

from .conftest import request, stream_lines

USER = [{"role": "user", "content": "rev abc"}]


def direct(path, prompt, **options):
    """What `dlmkit generate` decodes for ``prompt`` (prompt index 0, seed ``options``')."""
    loaded = load(path)
    return generate(loaded.model, loaded.tokenizer, [prompt], loaded.config(None, **options))


def tokens(response) -> list[list[int]]:
    return response.model_extra["dlmkit"]["tokens"]


@pytest.mark.parametrize("family", ["bd3lm", "mdlm", "idlm", "ar", "hybrid", "scdd"])
def test_completion_equals_generate(serve, export, family):
    server = serve(family)
    reply = server.client.completions.create(model="tiny", prompt="rev abc", max_tokens=8)
    expected = direct(export(family), "rev abc", max_new_tokens=8)
    assert tokens(reply) == expected.tokens
    choice = reply.choices[0]
    assert choice.text == expected.texts[0]
    assert choice.finish_reason == ("stop" if len(expected.tokens[0]) < 8 else "length")
    assert reply.usage.prompt_tokens == len(load(export(family)).tokenizer.apply_chat_template(
        USER, add_generation_prompt=True).input_ids)
    assert reply.usage.completion_tokens == expected.generated
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + expected.generated


def test_chat_renders_as_training(serve, export):
    server = serve("bd3lm")
    messages = [{"role": "system", "content": "be brief"}, *USER]
    reply = server.client.chat.completions.create(model="tiny", messages=messages,
                                                  max_tokens=8, seed=3, temperature=0.7)
    expected = direct(export("bd3lm"), messages, max_new_tokens=8, seed=3, temperature=0.7)
    assert tokens(reply) == expected.tokens
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected.texts[0]
    assert reply.object == "chat.completion"


def test_models_health_and_n(serve):
    server = serve("bd3lm")
    assert [m.id for m in server.client.models.list().data] == ["tiny"]
    health = request(server.url, "GET", "/health").json()
    assert health["status"] == "ok" and health["sampler"] == "bd3lm"
    # n choices: choice j is seeded (seed, j), as prompt j of a `dlmkit generate` batch
    reply = server.client.completions.create(model="tiny", prompt="rev abc", max_tokens=8, n=3,
                                             temperature=1.0, seed=5)
    loaded = load(server.service.loaded.path)
    batch = generate(loaded.model, loaded.tokenizer, ["rev abc"] * 3,
                     loaded.config(None, max_new_tokens=8, temperature=1.0, seed=5))
    assert tokens(reply) == batch.tokens
    assert [c.index for c in reply.choices] == [0, 1, 2]


def test_extension_options_validated_as_generate(serve, export):
    server = serve("bd3lm")
    options = {"threshold": 0.3, "cache": "prefix", "steps": 4}
    reply = server.client.completions.create(model="tiny", prompt="rev abc", max_tokens=8,
                                             extra_body={"dlmkit": options})
    assert tokens(reply) == direct(export("bd3lm"), "rev abc", max_new_tokens=8,
                                   **options).tokens
    with pytest.raises(openai.BadRequestError) as bad:
        server.client.completions.create(model="tiny", prompt="rev abc",
                                         extra_body={"dlmkit": {"threshold": 2}})
    assert bad.value.status_code == 400
    assert "threshold must be a number in (0, 1], got 2" in bad.value.message
    with pytest.raises(openai.BadRequestError) as bad:  # the same check as --block-size
        server.client.completions.create(model="tiny", prompt="rev abc",
                                         extra_body={"dlmkit": {"block_size": 2}})
    assert "block_size 2 differs from the block size the model was trained with (4" \
        in bad.value.message


def _post(server, path, body):
    return request(server.url, "POST", path, body)


BAD = [  # (body, status, words of the message, param)
    (b'{"model": "tiny", "prompt": ', 400, "request body is not valid JSON", None),
    ({"model": "tiny", "prompt": "x", "frequency_penalty": 1}, 400,
     "unknown field 'frequency_penalty'", "frequency_penalty"),
    ({"model": "tiny", "prompt": "x", "max_tokens": "8"}, 400,
     "max_tokens: Input should be a valid integer, got '8'", "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens:", "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 5000}, 400,
     "5000 more are decoded after it", "max_tokens"),
    ({"model": "tiny", "prompt": ""}, 400, "prompt is empty", "prompt"),
    ({"model": "tiny", "prompt": [5] * 1100}, 400, "the prompt is 1100 tokens", "max_tokens"),
    ({"model": "tiny", "prompt": [999]}, 400, "token id 999 is outside the vocabulary",
     "prompt"),
    ({"model": "other", "prompt": "x"}, 404, "model 'other' is not served here", "model"),
    ({"model": "tiny", "prompt": "x", "n": 17}, 400, "n:", "n"),
    ({"model": "tiny", "prompt": "x", "stop": ""}, 400, "stop: an empty string", "stop"),
    ({"model": "tiny", "prompt": "x", "dlmkit": {"max_new_tokens": 4}}, 400,
     "dlmkit.max_new_tokens: set the request's 'max_tokens' field", "dlmkit.max_new_tokens"),
    ({"model": "tiny", "prompt": "x", "dlmkit": {"bogus": 1}}, 400,
     "unknown sampler option(s) ['bogus']", "dlmkit"),
    ({"model": "tiny", "prompt": "x", "dlmkit": {"revise": True}}, 400,
     "does not use option(s) ['revise']", "dlmkit"),
    ({"model": "tiny"}, 400, "missing required field 'prompt'", "prompt"),
    ([1, 2], 400, "request body:", None),
]


@pytest.mark.parametrize("body,status,words,param", BAD)
def test_bad_request_then_served(serve, body, status, words, param):
    server = serve("bd3lm")
    response = _post(server, "/v1/completions", body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"], error["message"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    ok = server.client.completions.create(model="tiny", prompt="rev abc", max_tokens=4)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_bad_chat_and_routes(serve):
    server = serve("bd3lm")
    r = _post(server, "/v1/chat/completions",
              {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.role"
    r = _post(server, "/v1/chat/completions",
              {"model": "tiny", "messages": [*USER, {"role": "assistant", "content": "y"}]})
    assert r.status_code == 400
    assert "must not end with an assistant message" in r.json()["error"]["message"]
    r = _post(server, "/v1/chat/completions", {"model": "tiny", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = request(server.url, "GET", "/v1/engines")
    assert r.status_code == 404 and "no route GET /v1/engines" in r.json()["error"]["message"]
    assert request(server.url, "GET", "/health").status_code == 200


def test_stop_strings(serve):
    server = serve("ar")
    full = server.client.completions.create(model="tiny", prompt="rev abc", max_tokens=8)
    text = full.choices[0].text
    assert len(text) >= 3, text  # the tiny random model emits no stop token in 8 tokens
    cut = server.client.completions.create(model="tiny", prompt="rev abc", max_tokens=8,
                                           stop=[text[2:4], "never there"])
    assert cut.choices[0].text == text[:text.find(text[2:4])]
    assert cut.choices[0].finish_reason == "stop"


def test_same_tokens_alone_and_in_a_batch(serve):
    """Concurrent requests (different prompts, seeds, sampled) decode in one batch and give
    the tokens each gives alone."""
    server = serve("bd3lm", wait_ms=300)
    requests = [dict(prompt=p, seed=s, temperature=1.0, max_tokens=8)
                for p, s in [("rev abc", 1), ("sort 3142", 2), ("x", 3), ("rev abc", 4),
                             ("copy abcdefgh", 1), ("9+1=", 9)]]

    def ask(kw):
        return server.client.completions.create(model="tiny", **kw)

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(ask, requests))
    assert max(r.model_extra["dlmkit"]["batch_rows"] for r in together) > 1
    alone = [ask(kw) for kw in requests]
    assert [r.model_extra["dlmkit"]["batch_rows"] for r in alone] == [1] * len(requests)
    assert [tokens(r) for r in together] == [tokens(r) for r in alone]
    assert tokens(together[0]) != tokens(together[3])  # the seed matters


def _sse(server, body):
    head, lines = stream_lines(server.url, body)
    assert head.status_code == 200
    assert head.headers["content-type"].startswith("text/event-stream")
    return lines


@pytest.mark.parametrize("family,streams", [("ar", True), ("bd3lm", True), ("mdlm", False)])
def test_streaming(serve, family, streams):
    """Block-wise families stream as blocks commit (ar: each token; bd3lm: blocks of 4; a
    chunk holds what decodes to whole characters), mdlm settles its canvas at once: one
    chunk. Always ending in [DONE]."""
    server = serve(family)
    whole = server.client.completions.create(model="tiny", prompt="rev abc", max_tokens=8)
    assert whole.choices[0].finish_reason == "length"  # eight tokens: the chunk counts hold
    events = _sse(server, {"model": "tiny", "prompt": "rev abc", "max_tokens": 8,
                           "stream": True})
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["text"] for c in parsed if c["choices"][0]["text"]]
    assert "".join(texts) == whole.choices[0].text
    assert len(texts) >= 2 if streams else len(texts) == 1, texts
    assert parsed[-1]["choices"][0]["finish_reason"] == "length"


def test_streaming_chat_with_the_client(serve):
    server = serve("ar")
    whole = server.client.chat.completions.create(model="tiny", messages=USER, max_tokens=6)
    stream = server.client.chat.completions.create(model="tiny", messages=USER, max_tokens=6,
                                                   stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_client_gone_mid_stream(serve):
    server = serve("ar")
    head, lines = stream_lines(server.url, {"model": "tiny", "prompt": "rev abc",
                                            "max_tokens": 64, "stream": True}, stop_after=1)
    assert head.status_code == 200 and len(lines) == 1  # one event, then hang up
    reply = server.client.completions.create(model="tiny", prompt="rev abc", max_tokens=4)
    assert reply.choices[0].text is not None


def test_full_queue_gets_429(serve, monkeypatch):
    """One request decoding (held), one waiting (max_queue 1): the third gets 429, and the
    two are answered once the decoder moves on."""
    import dlmkit.serve.batching as batching

    server = serve("ar", max_queue=1, max_batch=1, wait_ms=0)
    started, release = threading.Event(), threading.Event()
    real = batching.generate

    def held(*args, **kw):
        started.set()
        release.wait(60)
        return real(*args, **kw)

    monkeypatch.setattr(batching, "generate", held)
    body = {"model": "tiny", "prompt": "rev abc", "max_tokens": 4}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(_post, server, "/v1/completions", body)
        assert started.wait(60)
        second = pool.submit(_post, server, "/v1/completions", body)
        for _ in range(200):  # until the second sits in the queue
            if server.service.batcher.queued == 1:
                break
            threading.Event().wait(0.02)
        with pytest.raises(openai.RateLimitError) as full:
            server.client.completions.create(**body)
        assert full.value.status_code == 429
        assert "the request queue is full (1 waiting" in full.value.message
        release.set()
        assert first.result().status_code == 200 and second.result().status_code == 200


def test_api_key(serve):
    server = serve("ar", api_key="sesame")
    assert server.client.completions.create(model="tiny", prompt="x", max_tokens=2).choices
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as denied:
        wrong.models.list()
    assert "missing or wrong API key" in denied.value.message
    assert request(server.url, "GET", "/health").status_code == 200  # no key needed


def test_speculative_pair_with_draft(serve):
    """`--draft`: the ar target with a DFlash drafter decodes as dflash; greedy output equals
    the target's own, streamed as verified blocks land."""
    pair = serve("ar", draft=True)
    plain = serve("ar")
    reply = pair.client.completions.create(model="tiny", prompt="rev abc", max_tokens=8)
    assert reply.model_extra["dlmkit"]["sampler"] == "dflash"
    same = plain.client.completions.create(model="tiny", prompt="rev abc", max_tokens=8)
    assert tokens(reply) == tokens(same)
    events = _sse(pair, {"model": "tiny", "prompt": "rev abc", "max_tokens": 8,
                         "stream": True})
    assert events[-1] == "[DONE]"
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
    assert "".join(texts) == reply.choices[0].text


def test_stop_strings_in_a_stream(serve):
    server = serve("ar")
    text = server.client.completions.create(model="tiny", prompt="rev abc",
                                            max_tokens=8).choices[0].text
    stop = text[3:5]
    events = _sse(server, {"model": "tiny", "prompt": "rev abc", "max_tokens": 8,
                           "stream": True, "stop": stop})
    parsed = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in parsed) == text[:text.find(stop)]
    assert parsed[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1] == "[DONE]"


def test_draining_server_answers_503(serve):
    server = serve("ar", wait_ms=1)  # its own server: the batcher is stopped here
    server.service.batcher.close()
    reply = _post(server, "/v1/completions", {"model": "tiny", "prompt": "x"})
    assert reply.status_code == 503
    assert reply.json()["error"]["code"] == "shutting_down"
