"""OpenAI-compatible HTTP server over one `LLMEngine` (stdlib only).

    HTTP threads (one per connection)            engine thread (the only caller of the engine)
    parse + validate JSON, tokenize  ──inbox──▶  add_request / abort_request, step(), route outputs
    wait on the request's own queue  ◀─sink───   RequestOutput per new token, or an error

Validation happens in the HTTP thread, so a bad request gets its 400 (message naming the field) without ever
reaching the engine, and other requests are unaffected. Endpoints: GET /health, GET /v1/models,
POST /v1/completions, POST /v1/chat/completions (both with `"stream": true` as server-sent events), and
GET /metrics (Prometheus text) when a registry is given. Every response carries the request's time to first token in
`usage.ttft_seconds` (and the final stream chunk's `usage`); `on_ttft(seconds)` sees each one as it happens.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kvpool.engine_adapter.llm_engine import LLMEngine, RequestOutput
from kvpool.engine_adapter.sampling import SamplingParams

log = logging.getLogger(__name__)

_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "max_tokens", "seed", "stop_token_ids", "ignore_eos")


class BadRequest(ValueError):
    """A client mistake; the message names the field."""


class _EngineLoop(threading.Thread):
    def __init__(self, engine: LLMEngine, on_ttft=None) -> None:
        super().__init__(name="engine", daemon=True)
        self.engine = engine
        self.on_ttft = on_ttft
        self.inbox: queue.Queue = queue.Queue()
        self.sinks: dict[str, queue.Queue] = {}
        self.stopped = threading.Event()

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
               kv_transfer_params: dict | None = None) -> queue.Queue:
        sink: queue.Queue = queue.Queue()
        self.inbox.put(("add", request_id, prompt_ids, params, sink, time.perf_counter(), kv_transfer_params))
        return sink

    def abort(self, request_id: str) -> None:
        self.inbox.put(("abort", request_id))

    def run(self) -> None:
        engine = self.engine
        while not self.stopped.is_set():
            try:
                block = not engine.has_unfinished_requests()
                while True:
                    self._handle(self.inbox.get(timeout=0.05) if block else self.inbox.get_nowait())
                    block = False
            except queue.Empty:
                pass
            if not engine.has_unfinished_requests():
                continue
            try:
                outputs = engine.step()
            except Exception as exc:  # an engine bug fails the in-flight requests, not the server
                log.exception("engine step failed")
                for rid, sink in list(self.sinks.items()):
                    engine.abort_request(rid)
                    sink.put(RuntimeError(f"engine error: {exc}"))
                self.sinks.clear()
                continue
            for out in outputs:
                if self.on_ttft is not None and len(out.token_ids) == 1 and out.ttft is not None:
                    self.on_ttft(out.ttft)
                sink = self.sinks.get(out.request_id)
                if sink is not None:
                    sink.put(out)
                    if out.finished:
                        del self.sinks[out.request_id]

    def _handle(self, item: tuple) -> None:
        if item[0] == "abort":
            self.engine.abort_request(item[1])
            self.sinks.pop(item[1], None)
            return
        _, rid, prompt_ids, params, sink, arrival, kv_params = item
        try:
            self.engine.add_request(prompt_ids, params, rid, arrival_time=arrival, kv_transfer_params=kv_params)
        except ValueError as exc:
            sink.put(BadRequest(str(exc)))
            return
        self.sinks[rid] = sink


def _field_of(message: str) -> str:
    head = message.split(":", 1)[0].split(" ", 1)[0]
    return head if head.replace("_", "").replace(".", "").replace("[", "").replace("]", "").isalnum() else ""


class EngineServer:
    """`with EngineServer(engine, port=0) as srv: ... srv.url` — serves until closed."""

    def __init__(self, engine: LLMEngine, host: str = "127.0.0.1", port: int = 8000,
                 model_name: str | None = None, metrics_registry=None, on_ttft=None) -> None:
        self.engine = engine
        self.model_name = model_name or engine.config.model_name
        self.metrics_registry = metrics_registry
        self.loop = _EngineLoop(engine, on_ttft)
        self.httpd = ThreadingHTTPServer((host, port), _make_handler(self))
        self.httpd.daemon_threads = True
        self._http_thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "EngineServer":
        self.loop.start()
        self._http_thread.start()
        return self

    def serve_forever(self) -> None:
        self.loop.start()
        try:
            self.httpd.serve_forever()
        finally:
            self.loop.stopped.set()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.loop.stopped.set()
        self.loop.join(timeout=10)

    def __enter__(self) -> "EngineServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # request parsing ------------------------------------------------------------------------------------------
    def parse(self, path: str, body: dict) -> tuple[list[int], SamplingParams, bool, dict | None]:
        """-> (prompt token ids, sampling params, stream, kv_transfer_params); BadRequest naming the field on any
        mistake. `kv_transfer_params` (a JSON object, as vLLM names it) is handed to the connector through the
        request (kvpool/hooks.py), e.g. {"pin_s": 600}."""
        if not isinstance(body, dict):
            raise BadRequest("body: must be a JSON object")
        if path == "/v1/chat/completions":
            try:
                prompt = self.engine.tokenizer.apply_chat_template(body.get("messages"))
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            if "max_completion_tokens" in body and "max_tokens" not in body:
                body = {**body, "max_tokens": body["max_completion_tokens"]}
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            if not isinstance(prompt, (str, list)):
                raise BadRequest("prompt: must be a string or a list of token ids (one prompt per request)")
        stop = body.get("stop")
        if stop not in (None, [], ""):
            raise BadRequest("stop: stop strings are not supported; use stop_token_ids")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest(f"stream: must be a boolean, got {stream!r}")
        kv_params = body.get("kv_transfer_params")
        if kv_params is not None and not isinstance(kv_params, dict):
            raise BadRequest(f"kv_transfer_params: must be a JSON object, got {kv_params!r}")
        kwargs = {k: body[k] for k in _SAMPLING_FIELDS if body.get(k) is not None}
        if isinstance(kwargs.get("stop_token_ids"), list):
            kwargs["stop_token_ids"] = tuple(kwargs["stop_token_ids"])
        try:
            params = SamplingParams(**kwargs)
            prompt_ids = self.engine.encode_prompt(prompt)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return prompt_ids, params, stream, kv_params


def _usage(out: RequestOutput) -> dict:
    return {"prompt_tokens": len(out.prompt_token_ids), "completion_tokens": len(out.token_ids),
            "total_tokens": len(out.prompt_token_ids) + len(out.token_ids), "ttft_seconds": out.ttft,
            "cached_tokens_local": out.num_cached_tokens_local,
            "cached_tokens_external": out.num_cached_tokens_external}


def _make_handler(server: EngineServer):
    class Handler(BaseHTTPRequestHandler):
        server_version = "kvpool-engine/0.1"

        def log_message(self, fmt, *args) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

        def _json(self, code: int, payload: dict, headers: dict | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, message: str) -> None:
            kind = "invalid_request_error" if code == 400 else "server_error" if code >= 500 else "not_found"
            self._json(code, {"error": {"message": message, "type": kind, "param": _field_of(message) or None,
                                        "code": code}})

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {"status": "ok"})
            elif self.path == "/metrics" and server.metrics_registry is not None:
                from kvpool.metrics import render_metrics

                data, content_type = render_metrics(server.metrics_registry)
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": server.model_name, "object": "model",
                                                             "owned_by": "kvpool"}]})
            else:
                self._error(404, f"path: {self.path} not found")

        def do_POST(self) -> None:
            if self.path == "/v1/kvpool/flush":
                # Saves are asynchronous: a caller that must see them in the pool (a demo, a test) waits here for
                # the connector's queue to drain instead of guessing with sleeps.
                self._json(200, {"flushed": bool(server.engine.connector.flush(60.0))})
                return
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._error(404, f"path: {self.path} not found")
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"null")
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise BadRequest(f"body: malformed JSON ({exc})") from None
                prompt_ids, params, stream, kv_params = server.parse(self.path, body)
            except BadRequest as exc:
                self._error(400, str(exc))
                return
            chat = self.path == "/v1/chat/completions"
            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
            sink = server.loop.submit(rid, prompt_ids, params, kv_params)
            try:
                if stream:
                    self._stream(rid, sink, chat)
                else:
                    self._unary(rid, sink, chat)
            except (BrokenPipeError, ConnectionResetError):
                server.loop.abort(rid)

        def _next(self, sink: queue.Queue):
            item = sink.get()
            if isinstance(item, Exception):
                raise item
            return item

        def _unary(self, rid: str, sink: queue.Queue, chat: bool) -> None:
            try:
                out = self._next(sink)
                while not out.finished:
                    out = self._next(sink)
            except BadRequest as exc:
                self._error(400, str(exc))
                return
            except RuntimeError as exc:
                self._error(500, str(exc))
                return
            choice = {"index": 0, "finish_reason": out.finish_reason, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": out.text}
            else:
                choice["text"] = out.text
            self._json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": server.model_name, "choices": [choice],
                             "usage": _usage(out)}, headers={"x-ttft": f"{out.ttft:.6f}"})

        def _stream(self, rid: str, sink: queue.Queue, chat: bool) -> None:
            try:
                first = self._next(sink)  # a rejected request still gets a plain 400, not an event stream
            except BadRequest as exc:
                self._error(400, str(exc))
                return
            except RuntimeError as exc:
                self._error(500, str(exc))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("x-ttft", f"{first.ttft:.6f}")
            self.end_headers()
            obj = "chat.completion.chunk" if chat else "text_completion"
            sent = ""
            out = first
            while True:
                text = out.text
                if not out.finished and text.endswith("\ufffd"):
                    delta = ""  # an incomplete UTF-8 sequence: wait for the next token
                else:
                    delta, sent = text[len(sent):], text
                choice: dict = {"index": 0, "finish_reason": out.finish_reason if out.finished else None}
                if chat:
                    choice["delta"] = {"content": delta} if out is not first else {"role": "assistant",
                                                                                  "content": delta}
                else:
                    choice["text"] = delta
                chunk = {"id": rid, "object": obj, "created": int(time.time()), "model": server.model_name,
                         "choices": [choice]}
                if out.finished:
                    chunk["usage"] = _usage(out)
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                if out.finished:
                    break
                try:
                    out = self._next(sink)
                except RuntimeError as exc:
                    err = {"error": {"message": str(exc), "type": "server_error", "code": 500}}
                    self.wfile.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                    break
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler
