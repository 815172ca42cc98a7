"""OpenAI-compatible server on 127.0.0.1: completions, chat, SSE streaming, health, 400s beside good requests."""

from __future__ import annotations

import http.client
import json
import threading

import pytest

from kvpool.engine_adapter.llm_engine import LLMEngine
from kvpool.engine_adapter.sampling import SamplingParams
from kvpool.engine_adapter.server import EngineServer


@pytest.fixture(scope="module")
def server(model_path):
    """Its own engine (an engine has one caller: the server's engine thread); expectations come from `llm`."""
    engine = LLMEngine(model=model_path, num_kv_blocks=256, max_model_len=1024, max_num_seqs=8)
    with EngineServer(engine, "127.0.0.1", 0) as srv:  # port 0: the kernel picks a free one, no race
        yield srv


def call(server, method, path, body=None, raw: bytes | None = None):
    host, port = server.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=120)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp, payload


def sse_events(payload: bytes) -> list:
    events = []
    for block in payload.decode().split("\n\n"):
        if block.startswith("data: "):
            text = block[len("data: "):]
            events.append(text if text == "[DONE]" else json.loads(text))
    return events


def test_health_and_models(server):
    resp, body = call(server, "GET", "/health")
    assert resp.status == 200 and json.loads(body) == {"status": "ok"}
    resp, body = call(server, "GET", "/v1/models")
    assert json.loads(body)["data"][0]["id"] == "smollm2-135m"
    resp, body = call(server, "GET", "/nope")
    assert resp.status == 404


def test_completion_matches_offline_engine_and_reports_ttft(server, llm, prompts):
    expected = llm.tokenizer.decode(
        llm.generate(prompts[0], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].token_ids)
    resp, body = call(server, "POST", "/v1/completions",
                      {"prompt": prompts[0], "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert resp.status == 200
    doc = json.loads(body)
    assert doc["object"] == "text_completion"
    assert doc["choices"][0]["text"] == expected and doc["choices"][0]["finish_reason"] == "length"
    usage = doc["usage"]
    assert usage["prompt_tokens"] == len(llm.tokenizer.encode(prompts[0])) and usage["completion_tokens"] == 8
    assert usage["ttft_seconds"] > 0 and float(resp.getheader("x-ttft")) == pytest.approx(usage["ttft_seconds"],
                                                                                           abs=1e-6)


def test_streaming_completion_concatenates_to_the_unary_text(server, prompts):
    body = {"prompt": prompts[1], "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    _, unary = call(server, "POST", "/v1/completions", body)
    resp, payload = call(server, "POST", "/v1/completions", {**body, "stream": True})
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    events = sse_events(payload)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == 10
    assert "".join(c["choices"][0]["text"] for c in chunks) == json.loads(unary)["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 9 + ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == 10 and chunks[-1]["usage"]["ttft_seconds"] > 0


def test_chat_completion_uses_the_gguf_template(server, llm):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = llm.tokenizer.apply_chat_template(messages)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    expected = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12))[0]
    resp, body = call(server, "POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 12,
                                                              "temperature": 0})
    doc = json.loads(body)
    assert doc["choices"][0]["message"] == {"role": "assistant", "content": expected.text}
    assert doc["usage"]["prompt_tokens"] == len(expected.prompt_token_ids)
    resp, payload = call(server, "POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 12,
                                                                 "temperature": 0, "stream": True})
    chunks = sse_events(payload)[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == expected.text


@pytest.mark.parametrize("body, param, message", [
    ({"prompt": "hi", "temperature": -1}, "temperature", "temperature must be a number in [0, 100], got -1"),
    ({"prompt": "hi", "top_p": 0}, "top_p", "top_p must be a number in (0, 1], got 0"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens", "max_tokens must be a positive int, got 0"),
    ({"prompt": [5] * 1100}, "prompt", "prompt: 1100 tokens do not fit the context of max_model_len=1024 tokens "
                                       "(at least one token must be left to generate)"),
    ({"prompt": 3}, "prompt", "prompt: must be a string or a list of token ids (one prompt per request)"),
    ({"prompt": "hi", "stream": "yes"}, "stream", "stream: must be a boolean, got 'yes'"),
    ({"prompt": "hi", "stop": ["\n"]}, "stop", "stop: stop strings are not supported; use stop_token_ids"),
])
def test_bad_completion_requests_get_400_naming_the_field(server, body, param, message):
    resp, payload = call(server, "POST", "/v1/completions", body)
    assert resp.status == 400
    assert json.loads(payload)["error"] == {"message": message, "type": "invalid_request_error", "param": param,
                                            "code": 400}


def test_malformed_json_and_bad_messages_get_400(server):
    resp, payload = call(server, "POST", "/v1/completions", raw=b'{"prompt": ')
    assert resp.status == 400 and json.loads(payload)["error"]["message"].startswith("body: malformed JSON")
    resp, payload = call(server, "POST", "/v1/chat/completions", {"messages": [{"role": "user"}]})
    assert resp.status == 400
    assert json.loads(payload)["error"]["message"] == "messages[0]: must be an object with string 'role' and " \
                                                      "'content'"


def test_bad_requests_do_not_disturb_concurrent_good_ones(server, llm, prompts):
    expected = [llm.tokenizer.decode(o.token_ids) for o in
                llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))]
    results: dict = {}

    def good(i):
        results[i] = call(server, "POST", "/v1/completions", {"prompt": prompts[i], "max_tokens": 6,
                                                              "temperature": 0, "ignore_eos": True})

    def bad(i):
        results[("bad", i)] = call(server, "POST", "/v1/completions", {"prompt": [1] * 5000, "max_tokens": 6})

    threads = [threading.Thread(target=good, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=bad, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i in range(3):
        resp, body = results[i]
        assert resp.status == 200 and json.loads(body)["choices"][0]["text"] == expected[i]
    assert all(results[("bad", i)][0].status == 400 for i in range(2))
    resp, _ = call(server, "GET", "/health")
    assert resp.status == 200


def test_client_disconnect_mid_stream_aborts_the_request(server, prompts):
    import socket
    import time

    host, port = server.httpd.server_address[:2]
    body = json.dumps({"prompt": prompts[0], "max_tokens": 500, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while b"data: " not in received:
            received += sock.recv(4096)
    # the handler's next write fails; it aborts the request, which frees its blocks long before 500 tokens
    engine = server.engine
    deadline = time.monotonic() + 120
    while engine.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.num_kv_blocks


def test_flush_route_waits_for_the_connectors_saves(server):
    # The default connector has nothing queued: flushed at once. A pool connector answers after its save queue
    # drained (tests/connector/test_cross_instance.py and `kvpool demo` wait on this instead of sleeping).
    resp, body = call(server, "POST", "/v1/kvpool/flush", {})
    assert resp.status == 200 and json.loads(body) == {"flushed": True}
