"""castor.adapters.agents.openai_http against a tiny fake server on 127.0.0.1.

The server is a test fake (there is no LLM here); the HTTP, sockets and
error paths of the adapter are real.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from castor.adapters.agents import make_agent
from castor.adapters.agents.openai_http import OpenAIChatAgent, chat_completions_url
from castor.ports.agent import TurnOutcome, TurnRequest

CONTEXT_ERROR = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


class FakeHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass

    def _send(self, status: int, body: bytes, content_length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body) if content_length is None else content_length))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_POST(self):  # noqa: N802 - http.server naming
        length = int(self.headers.get("Content-Length", "0"))
        request = json.loads(self.rfile.read(length))
        server = self.server
        server.received.append({"path": self.path, "body": request, "auth": self.headers.get("Authorization")})
        mode = server.mode
        if mode == "ok":
            body = {
                "model": request["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "echo: " + request["messages"][0]["content"]},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": 11,
                    "completion_tokens": 7,
                    "total_tokens": 18,
                    "prompt_tokens_details": {"cached_tokens": 2},
                },
            }
            self._send(200, json.dumps(body).encode())
        elif mode == "odd_usage":
            body = {"model": request["model"], "choices": [{"index": 0, "finish_reason": "stop",
                                                            "message": {"role": "assistant", "content": "answered"}}]}
            text = json.dumps(body)[:-1] + ', "usage": ' + server.usage_text + "}"
            self._send(200, text.encode())
        elif mode == "context":
            self._send(400, json.dumps(CONTEXT_ERROR).encode())
        elif mode == "error_in_200":
            self._send(200, json.dumps({"error": {"message": "tool call failed", "type": "tool_error"}}).encode())
        elif mode == "html_502":
            self._send(502, b"<html>bad gateway</html>")
        elif mode == "garbage":
            self._send(200, b"definitely not json")
        elif mode == "drop_mid_body":
            self._send(200, b'{"choices": [', content_length=5000)
            self.connection.shutdown(socket.SHUT_RDWR)
        elif mode == "drop_before_response":
            self.connection.shutdown(socket.SHUT_RDWR)
        elif mode == "hang":
            server.release.wait(10)
            self._send(200, b"{}")


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeHandler)
    srv.daemon_threads = True
    srv.mode = "ok"
    srv.received = []
    srv.release = threading.Event()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def base(srv) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def run(agent: OpenAIChatAgent, turn_id: str = "t1", timeout: float = 10.0, **kw) -> TurnOutcome:
    got: list[TurnOutcome] = []
    done = threading.Event()

    def reply(outcome: TurnOutcome) -> None:
        got.append(outcome)
        done.set()

    agent.run_turn(TurnRequest(turn_id=turn_id, cast_id="c", socket_id="Socket-1", visit=1, prompt="hi", **kw), reply)
    assert done.wait(timeout), "no reply"
    return got[0]


def test_url_building():
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("https://h/x/chat/completions") == "https://h/x/chat/completions"


def test_success_maps_text_usage_and_sends_model_and_key(server):
    agent = OpenAIChatAgent(base(server), model="default-model", api_key="sk-test", deadline_s=5)
    out = run(agent)
    assert (out.text, out.stop_reason, out.ok, out.model) == ("echo: hi", "stop", True, "default-model")
    assert (out.usage.input_tokens, out.usage.output_tokens, out.usage.total_tokens) == (11, 7, 18)
    assert out.usage.cache_read_tokens == 2 and out.usage.cost_usd is None
    sent = server.received[0]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == "Bearer sk-test"
    assert sent["body"]["messages"] == [{"role": "user", "content": "hi"}]
    out = run(agent, turn_id="t2", model="other")
    assert server.received[1]["body"]["model"] == "other"
    assert "sk-test" not in repr(agent)
    agent.close()


def test_provider_error_payload_is_preserved_and_classifies_as_context_window(server):
    server.mode = "context"
    agent = make_agent(f"openai:{base(server)}#m")
    out = run(agent)
    assert out.error.kind == "provider" and out.error.status == 400 and out.stop_reason == "error"
    assert out.error.payload == CONTEXT_ERROR
    # The classifier reads the message: the provider's code must be in it, as embedded JSON.
    assert "context_length_exceeded" in out.error.message and "error: {" in out.error.message
    agent.close()


def test_error_object_in_a_200_and_html_5xx(server):
    agent = OpenAIChatAgent(base(server), model="m", deadline_s=5)
    server.mode = "error_in_200"
    out = run(agent, "a")
    assert out.error.kind == "provider" and out.error.payload["error"]["type"] == "tool_error"
    server.mode = "html_502"
    out = run(agent, "b")
    assert out.error.kind == "provider" and out.error.status == 502 and "bad gateway" in out.error.payload
    # A provider payload is embedded so it is never read as a transport blip.
    assert "error: " in out.error.message and not out.error.message.endswith("finish_reason")
    agent.close()


def test_garbage_body_is_invalid_response(server):
    server.mode = "garbage"
    agent = OpenAIChatAgent(base(server), model="m", deadline_s=5)
    out = run(agent)
    assert out.error.kind == "invalid_response" and out.error.payload == "definitely not json"
    agent.close()


@pytest.mark.parametrize("mode", ["drop_mid_body", "drop_before_response"])
def test_dropped_connection_is_transport(server, mode):
    server.mode = mode
    agent = OpenAIChatAgent(base(server), model="m", deadline_s=5)
    out = run(agent)
    assert out.error.kind == "transport"
    # The seed's transient-transport phrase ends the message (classifier rule).
    assert out.error.message.endswith("stream ended without finish_reason")
    assert "error: {" not in out.error.message
    agent.close()


def test_connection_refused_is_transport_but_not_transient():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    agent = OpenAIChatAgent(f"http://127.0.0.1:{port}", model="m", deadline_s=5)
    out = run(agent)
    assert out.error.kind == "transport" and "cannot connect" in out.error.message
    assert not out.error.message.endswith("finish_reason")  # a wrong URL is not a blip
    agent.close()


@pytest.mark.timeout(20)
def test_deadline_ends_a_stalled_call(server):
    server.mode = "hang"
    agent = OpenAIChatAgent(base(server), model="m", deadline_s=0.5)
    out = run(agent, timeout=5)
    assert out.error.kind == "timeout" and "deadline" in out.error.message
    assert not re.search(r"timed?\s*out", out.error.message)  # would read as a tool timeout
    agent.close()


@pytest.mark.timeout(20)
def test_cancel_interrupts_the_call_and_replies_once(server):
    server.mode = "hang"
    agent = OpenAIChatAgent(base(server), model="m", deadline_s=30)
    got: list[TurnOutcome] = []
    done = threading.Event()
    agent.run_turn(TurnRequest(turn_id="t", cast_id="c", socket_id="Socket-1", visit=1, prompt="p"),
                   lambda o: (got.append(o), done.set()))
    agent.cancel("t")
    assert done.wait(5)
    assert got[0].error.kind == "cancelled" and got[0].stop_reason == "aborted"
    server.release.set()
    agent.close()
    assert len(got) == 1


def test_missing_model_is_refused_up_front(server):
    agent = OpenAIChatAgent(base(server))
    from castor.messages.errors import InvalidParams

    with pytest.raises(InvalidParams):
        agent.run_turn(TurnRequest(turn_id="t", cast_id="c", socket_id="s", visit=1, prompt="p"), lambda o: None)
    agent.close()


@pytest.mark.parametrize("usage_text", ['{"prompt_tokens": 12.5, "completion_tokens": 3}',
                                        '{"prompt_tokens": NaN, "completion_tokens": 1e400}',
                                        '{"prompt_tokens": "12", "completion_tokens": -4}', '"usage?"', "null"])
def test_odd_usage_figures_never_cost_the_answer(server, usage_text):
    """A fractional, NaN, out-of-range, string or negative figure failed the turn that had answered
    ("internal adapter error: ValidationError"); usage is telemetry: such a figure is not reported."""
    server.mode, server.usage_text = "odd_usage", usage_text
    agent = OpenAIChatAgent(base(server), model="m", deadline_s=5)
    out = run(agent)
    assert out.ok and out.text == "answered", out
    if usage_text.startswith('{"prompt_tokens": 12.5'):
        assert (out.usage.input_tokens, out.usage.output_tokens) == (12, 3)
    agent.close()


def test_cached_tokens_reach_the_engines_reading_of_the_usage(server):
    from castor.actors.materia.socket_actor import usage_map
    from castor.domain.materia.budget import extract_usage

    agent = OpenAIChatAgent(base(server), model="m", deadline_s=5)
    out = run(agent)
    assert extract_usage(usage_map(out)).tokens.cacheRead == 2  # OpenAI nests it: it was read as 0
    agent.close()


def test_a_usage_without_a_total_counts_the_cached_tokens_once(server):
    """OpenAI's prompt_tokens already hold the cached ones; lifted beside them, a total summed from
    the parts (input + output + cacheRead) counted them twice."""
    from castor.actors.materia.socket_actor import usage_map
    from castor.domain.materia.budget import extract_usage

    server.mode = "odd_usage"
    server.usage_text = json.dumps({"prompt_tokens": 11, "completion_tokens": 7,
                                    "prompt_tokens_details": {"cached_tokens": 2}})
    agent = OpenAIChatAgent(base(server), model="m", deadline_s=5)
    tokens = extract_usage(usage_map(run(agent))).tokens
    assert tokens.total == 18 and tokens.cacheRead == 2
    agent.close()


@pytest.mark.timeout(30)
def test_integers_past_a_doubles_range_in_the_usage_are_capped_not_a_crash(server):
    """An integer literal past a double's range (JSON allows any number of digits) anywhere in the
    usage crashed the turn that had answered ("internal adapter error: OverflowError": the usage's
    plain-JSON copy asked math.isfinite of it); it counts as large as castor counts (10^18), as the
    scripted agent reads it, and an unknown huge field is kept as the integer it is."""
    from castor.actors.materia.socket_actor import usage_map
    from castor.domain.materia.budget import MAX_FIGURE, extract_usage

    huge = "1" + "0" * 400
    server.mode = "odd_usage"
    server.usage_text = (f'{{"prompt_tokens": {huge}, "completion_tokens": {2**64 + 1}, "cost": 0.5, '
                         f'"extra": {{"counter": {huge}}}}}')
    agent = OpenAIChatAgent(base(server), model="m", deadline_s=5)
    out = run(agent)
    assert out.ok and out.text == "answered", out
    assert out.usage.input_tokens == MAX_FIGURE and out.usage.output_tokens == MAX_FIGURE
    usage = extract_usage(usage_map(out))
    assert usage.tokens.input == MAX_FIGURE and usage.tokens.output == MAX_FIGURE and usage.cost.total == 0.5
    assert usage_map(out)["extra"] == {"counter": int(huge)}
    agent.close()


@pytest.mark.timeout(30)
def test_an_integer_past_pythons_digit_limit_in_the_usage_is_capped_and_the_answer_kept(server):
    """A usage integer of more than 4,300 digits (Python's json refuses to read it) made the
    answered turn an ``invalid_response`` "not a chat completion"; it counts as 10^18 like any
    integer past the cap, and the answer stands."""
    from castor.actors.materia.socket_actor import usage_map
    from castor.domain.materia.budget import MAX_FIGURE, extract_usage

    server.mode = "odd_usage"
    server.usage_text = '{"prompt_tokens": 1' + "0" * 5000 + ', "completion_tokens": -' + "9" * 5000 + "}"
    agent = OpenAIChatAgent(base(server), model="m", deadline_s=5)
    out = run(agent)
    assert out.ok and out.text == "answered", out
    usage = extract_usage(usage_map(out))
    assert usage.tokens.input == MAX_FIGURE and usage.tokens.output == 0
    json.dumps(usage_map(out))  # the map stays writable
    agent.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", ["a figure", "an unknown field", "the usage itself"])
def test_a_usage_nested_thousands_of_levels_deep_keeps_the_answer_and_names_what_it_could_not_read(server, where):
    """A usage nested past Python's reader (some 1,000 levels: ``RecursionError``) made the answered
    turn an ``invalid_response`` "not a chat completion", the answer lost to an odd telemetry field.
    The answer is read with what nests past 64 levels cut: the answer stands, a figure cut is named
    unreadable and counts as not reported, the rest of the usage counts."""
    from castor.actors.materia.socket_actor import usage_map
    from castor.domain.materia.budget import extract_usage, unreadable_figures

    deep = "[" * 100_000 + "]" * 100_000
    server.mode = "odd_usage"
    server.usage_text = {"a figure": '{"prompt_tokens": 12, "completion_tokens": ' + deep + "}",
                         "an unknown field": '{"prompt_tokens": 12, "completion_tokens": 3, "trace": {"x": '
                                             + deep + "}}",
                         "the usage itself": deep}[where]
    agent = OpenAIChatAgent(base(server), model="m", deadline_s=5)
    out = run(agent)
    assert out.ok and out.text == "answered", out
    usage = usage_map(out)
    json.dumps(usage)  # the map stays writable (and shallow)
    if where == "the usage itself":
        assert out.usage.input_tokens is None and unreadable_figures(usage), usage
        return
    assert out.usage.input_tokens == 12 and extract_usage(usage).tokens.input == 12
    if where == "a figure":
        assert out.usage.output_tokens is None
        named = unreadable_figures(usage)
        assert [n for n in named if n.startswith("completion_tokens=")], named
    else:
        assert out.usage.output_tokens == 3 and extract_usage(usage).tokens.output == 3
        assert not unreadable_figures(usage), usage
    agent.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("byok, upstream, total", [
    (True, 0.0095, 0.01),  # a key of the user's own: the upstream provider bills its share apart
    (True, "0.0095", 0.01),  # a decimal string, as any cost may be
    (True, None, 0.0005),  # no upstream figure: the fee is all that is known
    (True, -1, 0.0005),  # not a cost figure: not counted, as everywhere
    (False, 0.0095, 0.0005),  # OpenRouter's own key: its cost is the whole charge already
    (True, 1e30, 10**18),  # past what castor counts: the sum is capped, never the fee alone
], ids=["byok", "byok-string", "byok-no-upstream", "byok-negative", "not-byok", "byok-past-the-cap"])
def test_an_openrouter_turn_on_the_user_s_own_key_costs_its_upstream_share_too(server, byok, upstream, total):
    """OpenRouter with a provider key of the user's own (BYOK) charges its fee as ``usage.cost`` and
    says what the provider charged the user's key in ``cost_details.upstream_inference_cost``: the
    turn cost both. castor read ``usage.cost`` alone as the turn's billed cost, a few percent of
    what was spent, and a ``maxCostUsd`` let some twenty times its figure through."""
    from castor.actors.materia.socket_actor import usage_map
    from castor.domain.materia.budget import extract_usage

    server.mode = "odd_usage"
    server.usage_text = json.dumps({
        "prompt_tokens": 194, "completion_tokens": 2, "total_tokens": 196, "cost": 0.0005, "is_byok": byok,
        "cost_details": {"upstream_inference_cost": upstream}, "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0}})
    agent = OpenAIChatAgent(base(server), model="m", deadline_s=5)
    out = run(agent)
    assert out.ok, out
    assert out.usage.cost_usd == total
    read = extract_usage(usage_map(out))
    assert read.cost.total == total and read.tokens.total == 196
    assert usage_map(out)["cost"]["totalFromProvider"] is True
    agent.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("total", [True, False], ids=["with-total", "no-total"])
def test_deepseek_s_cache_hits_are_its_cache_read_tokens(server, total):
    """DeepSeek reports the prompt tokens its cache served as ``prompt_cache_hit_tokens`` (beside
    ``prompt_cache_miss_tokens``, both inside ``prompt_tokens``), not OpenAI's nested
    ``cached_tokens``: castor counted no cache-read tokens for any DeepSeek turn. They are its
    cache-read tokens now, counted once in the total (inside the input, as OpenAI's)."""
    from castor.actors.materia.socket_actor import usage_map
    from castor.domain.materia.budget import extract_usage

    usage = {"prompt_tokens": 1200, "completion_tokens": 300, "prompt_cache_hit_tokens": 1000,
             "prompt_cache_miss_tokens": 200, "completion_tokens_details": {"reasoning_tokens": 120}}
    if total:
        usage["total_tokens"] = 1500
    server.mode = "odd_usage"
    server.usage_text = json.dumps(usage)
    agent = OpenAIChatAgent(base(server), model="deepseek-chat", deadline_s=5)
    out = run(agent)
    assert out.ok, out
    assert out.usage.cache_read_tokens == 1000
    read = extract_usage(usage_map(out)).tokens
    assert (read.input, read.output, read.cacheRead, read.total) == (1200, 300, 1000, 1500)
    agent.close()
