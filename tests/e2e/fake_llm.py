"""FAKE LLM for tests: an OpenAI-compatible chat-completions server on 127.0.0.1.

It stands in for a model provider, the one part of the harness that cannot exist
offline. Pi (provider ``api: "openai-completions"``) POSTs ``{baseUrl}/chat/completions``
with ``stream: true`` and reads SSE ``chat.completion.chunk`` frames; this server speaks
exactly that. A request with ``stream: false`` (castor's own ``openai:`` agent) gets one
``chat.completion`` JSON body.

Replies:
* a scripted queue (:meth:`FakeLLM.reply_text`, :meth:`FakeLLM.reply_tool_call`); a
  scripted reply with ``when=SUBSTRING`` is only consumed by a request whose text
  (all messages, system prompt included) contains that substring;
* otherwise the deterministic default: after a tool result → ``TOOL_RESULT_SEEN: <content>``;
  else ``FAKE-REPLY: `` + the user-side texts since the last assistant message joined
  with `` | `` (so injected context shows in the reply).

Every request body is kept in :attr:`FakeLLM.requests` (thread-safe) for assertions, with its
arrival time (``time.monotonic()``) in :attr:`FakeLLM.received_at`.
Run standalone: ``python fake_llm.py --port 0`` prints ``PORT n``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_USAGE: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
HOLD_MAX_S = 60.0  # a held reply goes out after this long even if its test never releases it
OMIT_USAGE = object()


@dataclass
class Scripted:
    text: str | None = None
    tool_call: tuple[str, dict[str, Any]] | None = None
    when: str | None = None
    status: int = 200
    delay: float = 0.0
    error: dict[str, Any] | None = None  # the provider's error object for a status != 200
    pause: float = 0.0  # seconds between a streamed text's first half and its second (a turn mid-stream)
    # the final chunk's ``usage`` as sent (OMIT_USAGE: no usage chunk at all)
    usage: Any = field(default_factory=lambda: dict(DEFAULT_USAGE))
    # the response waits until this is set (at most HOLD_MAX_S), after ``delay``: the test says when it comes
    hold: threading.Event | None = None


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def request_text(body: dict[str, Any]) -> str:
    return "\n".join(message_text(m) for m in body.get("messages", []))


def default_reply(body: dict[str, Any]) -> str:
    messages = body.get("messages", [])
    if messages and messages[-1].get("role") == "tool":
        return "TOOL_RESULT_SEEN: " + message_text(messages[-1])
    tail: list[str] = []
    for m in reversed(messages):
        if m.get("role") in ("assistant", "system"):
            break
        if m.get("role") == "user":
            tail.append(message_text(m))
    return "FAKE-REPLY: " + " | ".join(reversed(tail))


@dataclass
class FakeLLM:
    """The server plus its script and request log. Use as a context manager."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    received_at: list[float] = field(default_factory=list)  # time.monotonic() of each request, same order
    script: list[Scripted] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def reply_text(self, text: str, *, when: str | None = None, delay: float = 0.0, pause: float = 0.0,
                   usage: Any = DEFAULT_USAGE, hold: threading.Event | None = None) -> None:
        """Queue a text reply; ``delay`` seconds pass before the response starts, ``pause`` seconds
        between its first half and its second (the turn streams meanwhile); ``usage`` is the usage
        the stream ends with, as a provider wrote it (any JSON; ``OMIT_USAGE``: none); ``hold``: the
        response starts once the test sets it (a turn that streams until the test says)."""
        with self._lock:
            self.script.append(Scripted(text=text, when=when, delay=delay, pause=pause, usage=usage, hold=hold))

    def reply_tool_call(self, name: str, arguments: dict[str, Any], *, when: str | None = None,
                        delay: float = 0.0) -> None:
        """Queue a tool call; ``delay`` seconds pass before the response starts."""
        with self._lock:
            self.script.append(Scripted(tool_call=(name, arguments), when=when, delay=delay))

    def reply_error(self, status: int = 500, *, when: str | None = None, message: str | None = None,
                    code: str | None = None) -> None:
        """Queue an HTTP error; ``message`` / ``code`` fill the OpenAI-style ``{"error": {...}}`` body."""
        error = {"message": message or "fake upstream failure", "type": "invalid_request_error", "code": code}
        with self._lock:
            self.script.append(Scripted(status=status, when=when, error=error))

    def reply_context_overflow(self, *, when: str | None = None) -> None:
        """Queue the 400 an OpenAI-compatible provider sends for a prompt over the context window."""
        self.reply_error(400, when=when, code="context_length_exceeded",
                         message="This model's maximum context length is 32000 tokens. However, your messages "
                                 "resulted in 40000 tokens. Please reduce the length of the messages.")

    def take(self, body: dict[str, Any]) -> Scripted:
        text = request_text(body)
        with self._lock:
            self.requests.append(body)
            self.received_at.append(time.monotonic())
            for i, item in enumerate(self.script):
                if item.when is None or item.when in text:
                    return self.script.pop(i)
        return Scripted(text=default_reply(body))

    def log(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.requests)

    def timed_log(self) -> list[tuple[float, dict[str, Any]]]:
        """``(time.monotonic() at arrival, body)`` of every request, in arrival order."""
        with self._lock:
            return list(zip(self.received_at, self.requests, strict=True))

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self, port: int = 0) -> FakeLLM:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                if not self.path.endswith("/chat/completions"):
                    self._plain(404, b"not found")
                    return
                item = fake.take(body)
                if item.delay:
                    time.sleep(item.delay)  # a slow model, so a test can act mid-turn
                if item.hold is not None:
                    item.hold.wait(HOLD_MAX_S)
                try:
                    if item.status != 200:
                        self._plain(
                            item.status,
                            json.dumps({"error": item.error or {"message": "fake upstream failure"}}).encode(),
                        )
                        return
                    if body.get("stream") is False:
                        self._complete(body.get("model", "fake-model"), item)
                    else:
                        self._stream(body.get("model", "fake-model"), item)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up (an aborted turn): nothing to answer

            def _plain(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _complete(self, model: str, item: Scripted) -> None:
                """A non-streaming chat completion (castor's own OpenAI-compatible agent asks for one)."""
                message: dict[str, Any] = {"role": "assistant", "content": item.text or ""}
                finish = "stop"
                if item.tool_call is not None:
                    name, args = item.tool_call
                    message = {"role": "assistant", "content": None, "tool_calls": [{
                        "id": f"call_{time.monotonic_ns()}", "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)}}]}
                    finish = "tool_calls"
                body: dict[str, Any] = {
                    "id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
                    "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
                if item.usage is not OMIT_USAGE:
                    body["usage"] = item.usage
                self._plain(200, json.dumps(body).encode())

            def _stream(self, model: str, item: Scripted) -> None:
                cid, created = f"chatcmpl-{time.monotonic_ns()}", int(time.time())
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()

                def chunk(choices: list[Any], **extra: Any) -> None:
                    frame = {"id": cid, "object": "chat.completion.chunk", "created": created,
                             "model": model, "choices": choices, **extra}
                    self.wfile.write(b"data: " + json.dumps(frame).encode() + b"\n\n")

                if item.tool_call is not None:
                    name, args = item.tool_call
                    call = {"index": 0, "id": f"call_{time.monotonic_ns()}", "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)}}
                    chunk([{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}, "finish_reason": None}])
                    finish = "tool_calls"
                else:
                    text = item.text or ""
                    half = len(text) // 2
                    chunk([{"index": 0, "delta": {"role": "assistant", "content": text[:half]}, "finish_reason": None}])
                    if item.pause:
                        self.wfile.flush()
                        time.sleep(item.pause)  # mid-stream: the client has the first half
                    chunk([{"index": 0, "delta": {"content": text[half:]}, "finish_reason": None}])
                    finish = "stop"
                chunk([{"index": 0, "delta": {}, "finish_reason": finish}])
                if item.usage is not OMIT_USAGE:
                    chunk([], usage=item.usage)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fake-llm", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="FAKE OpenAI-compatible LLM for tests")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    fake = FakeLLM().start(args.port)
    print(f"PORT {fake.base_url.rsplit(':', 1)[1].split('/')[0]}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    main()
