"""Adapters against real sockets and real files: HttpClassifier, JsonlSessionLog."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from castor.adapters.classifier_http import HttpClassifier, parse_usage
from castor.adapters.session_jsonl import JsonlSessionLog
from castor.domain.icarus.classify import ChatMessage, ClassifierRequest
from castor.messages.errors import Internal, InvalidParams, Timeout


class _Server:
    """A tiny OpenAI-compatible server on 127.0.0.1 (test double for a local model)."""

    def __init__(self):
        self.mode = "ok"
        self.release = threading.Event()
        self.seen: list[dict] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body):
                raw = json.dumps(body).encode() if not isinstance(body, bytes) else body
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                self._send(200, {"data": [{"id": "tiny"}, {"id": "tinier"}]})

            def do_POST(self):
                n = int(self.headers["Content-Length"])
                outer.seen.append({"body": json.loads(self.rfile.read(n)), "auth": self.headers.get("Authorization")})
                if outer.mode == "slow":
                    outer.release.wait(5)
                if outer.mode == "500":
                    return self._send(500, {"error": "SECRET provider detail"})
                if outer.mode == "garbage":
                    return self._send(200, b"<html>nope</html>")
                body = {"choices": [{"message": {"role": "assistant", "content": '{"decisions": []}'}}]}
                if outer.mode == "ok":
                    body["usage"] = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
                self._send(200, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


REQ = ClassifierRequest(provider="local", model="tiny", max_tokens=64,
                        messages=(ChatMessage(role="system", content="s"), ChatMessage(role="user", content="u")))


def test_http_complete_and_usage(server):
    c = HttpClassifier(server.url, provider="local", api_key="k")
    resp = c.complete(REQ, time.monotonic() + 5)
    assert resp.text == '{"decisions": []}'
    assert resp.usage.input == 12 and resp.usage.output == 3 and resp.usage.cache_read is None
    sent = server.seen[0]
    assert sent["body"]["stream"] is False and sent["body"]["temperature"] == 0 and sent["body"]["max_tokens"] == 64
    assert sent["auth"] == "Bearer k"


def test_http_usage_absent_is_none(server):
    server.mode = "nousage"
    assert HttpClassifier(server.url).complete(REQ, time.monotonic() + 5).usage is None


def test_http_list_models_marks_loopback_local(server):
    models = HttpClassifier(server.url, provider="local").list_models(time.monotonic() + 5)
    assert [m.id for m in models] == ["tiny", "tinier"] and all(m.local for m in models)
    assert HttpClassifier(server.url, models=["fixed"]).list_models()[0].id == "fixed"


def test_http_error_carries_status_not_body(server):
    server.mode = "500"
    with pytest.raises(Internal) as ei:
        HttpClassifier(server.url).complete(REQ, time.monotonic() + 5)
    assert "500" in str(ei.value) and "SECRET" not in str(ei.value)


def test_http_garbage_body(server):
    server.mode = "garbage"
    with pytest.raises(Internal):
        HttpClassifier(server.url).complete(REQ, time.monotonic() + 5)


def test_http_deadline(server):
    server.mode = "slow"
    with pytest.raises(Timeout):  # the server answers after its slow delay: only the deadline raises
        HttpClassifier(server.url).complete(REQ, time.monotonic() + 0.3)
    with pytest.raises(Timeout):
        HttpClassifier(server.url).complete(REQ, time.monotonic() - 1)


def test_http_unreachable():
    with pytest.raises(Internal):
        HttpClassifier("http://127.0.0.1:9/v1").complete(REQ, time.monotonic() + 2)
    with pytest.raises(InvalidParams):
        HttpClassifier("file:///etc/passwd")


def test_parse_usage_unknown_fields_none():
    u = parse_usage({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 2}, "total_tokens": True})
    assert (u.input, u.output, u.cache_read, u.total_tokens, u.cost) == (5, None, 2, None, None)
    assert parse_usage(None) is None


def test_jsonl_log_appends_complete_lines(tmp_path):
    log = JsonlSessionLog(tmp_path / "deep" / "session.jsonl")
    log.append_entry("icarus-context-filter", {"n": 1}, time.monotonic() + 5)
    threads = [threading.Thread(target=log.append_entry, args=("t", {"n": i, "pad": "x" * 5000},
                                                              time.monotonic() + 5)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = (tmp_path / "deep" / "session.jsonl").read_text().splitlines()
    assert len(lines) == 9 and all(json.loads(line)["type"] == "custom" for line in lines)
    assert log.entries("icarus-context-filter")[0]["data"] == {"n": 1}
    assert sorted(e["data"]["n"] for e in log.entries("t")) == list(range(8))


def test_jsonl_log_refuses_after_deadline_and_bad_data(tmp_path):
    log = JsonlSessionLog(tmp_path / "s.jsonl")
    with pytest.raises(Timeout):
        log.append_entry("t", {}, time.monotonic() - 1)
    with pytest.raises(InvalidParams):
        log.append_entry("t", {"x": float("nan")}, time.monotonic() + 5)
    with pytest.raises(InvalidParams):
        log.append_entry("", {}, time.monotonic() + 5)
    assert log.entries() == []
