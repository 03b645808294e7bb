"""An OpenAI-compatible HTTP server on 127.0.0.1 for tests.

The real ``openai`` SDK talks to it over HTTP, so tests exercise the SDK's own retries, errors
and streaming. It serves chat completions (plain and streamed) and embeddings, records every
request, and fails on demand.

Embeddings are a hashed bag of words (normalised), so texts sharing words are near each other:
deterministic, fast, and good enough to test ranking. Chat replies come from ``chat_handler``
(default: a short deterministic digest of the messages) or from a queue of canned replies.
A reply may also be a dict, an assistant message with ``tool_calls`` (see ``tool_call_reply``),
so agent loops can be driven through a tool call.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORD = re.compile(r"[a-z0-9']+")


def hashed_embedding(text: str, dims: int) -> list[float]:
    vector = [0.0] * dims
    for word in WORD.findall(text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % dims
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def default_chat_reply(request: dict) -> str:
    texts = []
    for message in request.get("messages", []):
        content = message.get("content")
        if isinstance(content, str) and message.get("role") != "system":
            texts.append(content)
    return "Digest: " + " | ".join(t[:60] for t in texts[-5:])


class FakeOpenAIServer:
    def __init__(self, embedding_dims: int = 64) -> None:
        self.embedding_dims = embedding_dims
        self.requests: list[dict[str, Any]] = []
        self.chat_handler: Callable[[dict], str | dict] = default_chat_reply
        self._replies: deque[str | dict] = deque()
        self._failures: deque[tuple[int, dict]] = deque()
        self.delay = 0.0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    # -- control ------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self._replies.clear()
            self._failures.clear()
            self.chat_handler = default_chat_reply
            self.delay = 0.0

    def reply_with(self, *replies: str | dict) -> None:
        """Queue canned chat replies, used before ``chat_handler``.

        A dict reply is an assistant message: ``{"content": ..., "tool_calls": [...]}``; other keys
        (``reasoning_content``...) are sent as given.
        """
        with self._lock:
            self._replies.extend(replies)

    def fail_next(
        self, times: int = 1, status: int = 500, message: str = "injected failure"
    ) -> None:
        """The next ``times`` requests (any endpoint) answer ``status`` with an OpenAI error
        body."""
        body = {"error": {"message": message, "type": "server_error", "code": None, "param": None}}
        with self._lock:
            self._failures.extend([(status, body)] * times)

    def requests_to(self, path_suffix: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"].endswith(path_suffix)]

    # -- serving ------------------------------------------------------------------------------
    def _next_failure(self):
        with self._lock:
            return self._failures.popleft() if self._failures else None

    def _next_reply(self, request: dict) -> str | dict:
        with self._lock:
            if self._replies:
                return self._replies.popleft()
        return self.chat_handler(request)

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                payload = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.requests.append({"path": self.path, "body": payload})
                if server.delay:
                    time.sleep(server.delay)
                failure = server._next_failure()
                if failure:
                    return self._send(*failure)
                if self.path.endswith("/embeddings"):
                    return self._embeddings(payload)
                if self.path.endswith("/chat/completions"):
                    return self._chat(payload)
                return self._send(
                    404,
                    {
                        "error": {
                            "message": f"no route {self.path}",
                            "type": "invalid_request_error",
                        }
                    },
                )

            def _embeddings(self, payload):
                inputs = payload.get("input")
                inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
                dims = int(payload.get("dimensions") or server.embedding_dims)
                data = [
                    {"object": "embedding", "index": i, "embedding": hashed_embedding(text, dims)}
                    for i, text in enumerate(inputs)
                ]
                tokens = sum(len(WORD.findall(t.lower())) for t in inputs)
                self._send(
                    200,
                    {
                        "object": "list",
                        "data": data,
                        "model": payload.get("model", "fake"),
                        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                    },
                )

            def _chat(self, payload):
                reply = server._next_reply(payload)
                model = payload.get("model", "fake")
                created = int(time.time())
                if isinstance(reply, dict):
                    return self._chat_message(payload, reply, model, created)
                if not payload.get("stream"):
                    return self._send(
                        200,
                        {
                            "id": "chatcmpl-fake",
                            "object": "chat.completion",
                            "created": created,
                            "model": model,
                            "choices": [
                                {
                                    "index": 0,
                                    "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": reply},
                                }
                            ],
                            "usage": {
                                "prompt_tokens": 1,
                                "completion_tokens": 1,
                                "total_tokens": 2,
                            },
                        },
                    )
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                words = re.findall(r"\S+\s*", reply) or [""]
                for i, piece in enumerate(words):
                    delta = {"content": piece}
                    if i == 0:
                        delta["role"] = "assistant"
                    chunk = {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    if server.delay:
                        time.sleep(server.delay)
                final = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                }
                self.wfile.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

            def _chat_message(self, payload, reply: dict, model: str, created: int):
                """A canned assistant message (tool calls included), plain or as one streamed
                chunk."""
                # Other keys pass through (e.g. ``reasoning_content``, as some servers send).
                message = {"role": "assistant", "content": None, **reply}
                finish = "tool_calls" if reply.get("tool_calls") else "stop"
                if not payload.get("stream"):
                    return self._send(
                        200,
                        {
                            "id": "chatcmpl-fake",
                            "object": "chat.completion",
                            "created": created,
                            "model": model,
                            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                            "usage": {
                                "prompt_tokens": 1,
                                "completion_tokens": 1,
                                "total_tokens": 2,
                            },
                        },
                    )
                delta = dict(message)
                if "tool_calls" in delta:
                    delta["tool_calls"] = [
                        {**call, "index": i} for i, call in enumerate(delta["tool_calls"])
                    ]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for choice in (
                    {"index": 0, "delta": delta, "finish_reason": None},
                    {"index": 0, "delta": {}, "finish_reason": finish},
                ):
                    chunk = {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [choice],
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler


def tool_call_reply(
    name: str, arguments: dict, call_id: str = "call_1", content: str | None = None
) -> dict:
    """A canned assistant reply that calls the function ``name`` (for ``reply_with``)."""
    return {
        "content": content,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


if __name__ == "__main__":  # run by hand: python tests/openai_server.py
    srv = FakeOpenAIServer().start()
    print(srv.base_url, flush=True)
    threading.Event().wait()
