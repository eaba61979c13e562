"""castor.adapters.agents.scripted + the AgentPort models."""

from __future__ import annotations

import json
import threading

import pytest

from castor.adapters.agents import make_agent
from castor.adapters.agents.scripted import ScriptedAgent, load_script, parse_script
from castor.messages.errors import Conflict, InvalidConfig, InvalidParams
from castor.ports.agent import AgentPort, TurnOutcome, TurnRequest, enqueues_only, may_reply_inline


class Inbox:
    """Collects outcomes; waits on events, never sleeps."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: dict[str, list[TurnOutcome]] = {}
        self.threads: dict[str, int] = {}
        self.events: dict[str, threading.Event] = {}

    def reply_for(self, turn_id: str):
        self.events[turn_id] = threading.Event()

        def reply(outcome: TurnOutcome) -> None:
            with self.lock:
                self.outcomes.setdefault(turn_id, []).append(outcome)
                self.threads[turn_id] = threading.get_ident()
            self.events[turn_id].set()

        return reply

    def get(self, turn_id: str, timeout: float = 5.0) -> TurnOutcome:
        assert self.events[turn_id].wait(timeout), f"no reply for {turn_id}"
        return self.outcomes[turn_id][0]


def req(turn_id: str, cast_id: str = "c1", socket_id: str = "Socket-1", **kw) -> TurnRequest:
    return TurnRequest(turn_id=turn_id, cast_id=cast_id, socket_id=socket_id, visit=1, prompt="SECRET PROMPT", **kw)


def test_turn_request_hides_prompt_and_is_frozen():
    r = req("t1", summary="Socket-1: plan")
    assert "SECRET PROMPT" not in repr(r)
    with pytest.raises(ValueError):
        r.prompt = "x"  # type: ignore[misc]  # the test proves the request is frozen
    with pytest.raises(ValueError):
        TurnRequest(turn_id="t", cast_id="c", socket_id="s", visit=1, prompt="p", tools="everything")


def test_zero_latency_reply_is_off_the_callers_stack_and_in_order():
    agent = ScriptedAgent(parse_script(["first", {"text": "second", "usage": {"input_tokens": 3}}]))
    assert isinstance(agent, AgentPort)
    inbox = Inbox()
    caller = threading.get_ident()
    agent.run_turn(req("t1"), inbox.reply_for("t1"))
    agent.run_turn(req("t2"), inbox.reply_for("t2"))
    one, two = inbox.get("t1"), inbox.get("t2")
    assert (one.text, one.stop_reason, one.ok) == ("first", "stop", True)
    assert two.text == "second" and two.usage.input_tokens == 3 and two.usage.output_tokens is None
    assert inbox.threads["t1"] != caller and inbox.threads["t2"] != caller
    agent.close()


def test_an_enqueue_only_reply_is_told_at_once_on_the_callers_thread_and_only_once():
    """A reply marked enqueues_only (an actor tell) needs no hop: a ready answer arrives before
    run_turn returns, on the calling thread; a plain callback still never does."""
    agent = ScriptedAgent(parse_script({"*": ["now", {"text": "later", "delay_ms": 30}, "plain"]}))
    inbox = Inbox()
    caller = threading.get_ident()
    agent.run_turn(req("t1"), enqueues_only(inbox.reply_for("t1")))
    assert inbox.events["t1"].is_set() and inbox.threads["t1"] == caller  # delivered inline
    agent.cancel("t1")  # settled already: nothing more
    agent.run_turn(req("t2"), enqueues_only(inbox.reply_for("t2")))
    assert inbox.get("t2").text == "later" and inbox.threads["t2"] != caller  # from the timer thread
    agent.run_turn(req("t3"), inbox.reply_for("t3"))
    assert inbox.get("t3").text == "plain" and inbox.threads["t3"] != caller
    assert [len(inbox.outcomes[t]) for t in ("t1", "t2", "t3")] == [1, 1, 1]
    assert may_reply_inline(enqueues_only(lambda _o: None)) and not may_reply_inline(lambda _o: None)
    agent.close()


def test_actor_style_reentry_never_happens_on_the_same_stack():
    agent = ScriptedAgent(parse_script(["a", "b"]))
    local = threading.local()
    nested: list[bool] = []
    done = threading.Event()

    def reply(outcome: TurnOutcome) -> None:
        nested.append(getattr(local, "inside", False))
        local.inside = True
        try:
            if outcome.turn_id == "t1":
                agent.run_turn(req("t2"), reply)  # the "actor" asks again from its handler
            else:
                done.set()
        finally:
            local.inside = False

    agent.run_turn(req("t1"), reply)
    assert done.wait(5)
    assert nested == [False, False]
    agent.close()


def test_socket_keyed_answers_with_per_cast_cursors():
    script = parse_script({"Socket-1": ["plan A", "plan B"], "*": ["shared"]})
    agent = ScriptedAgent(script)
    inbox = Inbox()
    calls = [("a1", "cast-a", "Socket-1"), ("b1", "cast-b", "Socket-1"), ("a2", "cast-a", "Socket-1"),
             ("a3", "cast-a", "Socket-9"), ("b2", "cast-b", "Socket-9")]
    for turn_id, cast_id, socket_id in calls:
        agent.run_turn(req(turn_id, cast_id, socket_id), inbox.reply_for(turn_id))
    texts = {t: inbox.get(t).text for t, _, _ in calls}
    assert texts == {"a1": "plan A", "b1": "plan A", "a2": "plan B", "a3": "shared", "b2": "shared"}
    assert [r.turn_id for r in agent.requests()] == ["a1", "b1", "a2", "a3", "b2"]
    agent.close()


def test_the_request_history_keeps_only_the_latest_requests(monkeypatch):
    # A scripted server that runs for days must not keep every prompt it was sent.
    import castor.adapters.agents.scripted as scripted

    monkeypatch.setattr(scripted, "HISTORY_KEPT", 3)
    agent = ScriptedAgent(parse_script({"*": ["ok"] * 5}))
    inbox = Inbox()
    for n in range(5):
        agent.run_turn(req(f"t{n}", "cast-a"), inbox.reply_for(f"t{n}"))
        inbox.get(f"t{n}")
    assert [r.turn_id for r in agent.requests()] == ["t2", "t3", "t4"]
    agent.close()


def test_exhaustion_is_a_clear_error_outcome():
    agent = ScriptedAgent(parse_script(["only"]))
    inbox = Inbox()
    agent.run_turn(req("t1"), inbox.reply_for("t1"))
    agent.run_turn(req("t2"), inbox.reply_for("t2"))
    assert inbox.get("t1").ok
    out = inbox.get("t2")
    assert not out.ok and out.error.kind == "exhausted" and "exhausted" in out.error.message
    agent.close()


def test_scripted_errors_keep_payloads():
    payload = {"error": {"code": "context_length_exceeded", "message": "too long"}}
    agent = ScriptedAgent(parse_script([
        {"error": "WebSocket closed 1006"},
        {"error": {"message": "provider said no", "payload": payload, "status": 400}, "text": "partial"},
    ]))
    inbox = Inbox()
    agent.run_turn(req("t1"), inbox.reply_for("t1"))
    agent.run_turn(req("t2"), inbox.reply_for("t2"))
    first, second = inbox.get("t1"), inbox.get("t2")
    assert first.stop_reason == "error" and first.error.message == "WebSocket closed 1006"
    assert second.error.payload == payload and second.error.status == 400 and second.text == "partial"
    agent.close()


def test_delayed_answer_can_be_cancelled_exactly_once():
    agent = ScriptedAgent(parse_script([{"text": "late", "delay_ms": 5000}, {"text": "quick", "delay_ms": 20}]))
    inbox = Inbox()
    agent.run_turn(req("slow"), inbox.reply_for("slow"))
    agent.run_turn(req("fast"), inbox.reply_for("fast"))
    assert inbox.get("fast").text == "quick"
    agent.cancel("slow")
    agent.cancel("slow")
    out = inbox.get("slow")
    assert out.stop_reason == "aborted" and out.error.kind == "cancelled"
    assert agent.in_flight() == []
    agent.close()
    assert len(inbox.outcomes["slow"]) == 1


def test_duplicate_in_flight_turn_is_refused():
    agent = ScriptedAgent(parse_script([{"text": "x", "delay_ms": 5000}, "y"]))
    inbox = Inbox()
    agent.run_turn(req("t1"), inbox.reply_for("t1"))
    with pytest.raises(Conflict):
        agent.run_turn(req("t1"), lambda o: None)
    agent.close()  # cancels t1
    assert inbox.get("t1").stop_reason == "aborted"


def test_script_files_json_and_jsonl(tmp_path):
    jf = tmp_path / "s.json"
    jf.write_text(json.dumps({"Socket-2": ["two"], "*": ["any"]}))
    assert load_script(jf).by_socket["Socket-2"][0].text == "two"
    lf = tmp_path / "s.jsonl"
    lf.write_text('"plain"\n\n{"text": "for two", "socket": "Socket-2"}\n{"text": "u", "usage": {"inputTokens": 3}}\n')
    script = load_script(lf)
    assert [a.text for a in script.by_socket["*"]] == ["plain", "u"]
    assert script.by_socket["*"][1].usage.raw == {"inputTokens": 3}
    assert script.by_socket["Socket-2"][0].text == "for two"
    agent = make_agent(f"script:{lf}")
    assert isinstance(agent, ScriptedAgent)
    agent.close()


@pytest.mark.parametrize(
    "content",
    ['{"Socket-1": "not a list"}', '[{"text": "x", "bogus": 1}]', '[{"delay_ms": -1}]', "{not json\n", "42"],
)
def test_malformed_scripts_are_invalid_config(tmp_path, content):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(InvalidConfig):
        load_script(f)


def test_make_agent_rejects_bad_specs(tmp_path):
    for spec in ("", "script:", "nope:x", "openai:ftp://x"):
        with pytest.raises(InvalidParams):
            make_agent(spec)
    with pytest.raises(InvalidConfig):
        make_agent(f"script:{tmp_path / 'missing.json'}")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("figure", ["12", True, -3, None, float("nan")])
def test_a_scripted_usage_figure_that_is_not_a_number_is_not_reported_as_from_any_agent(figure):
    """A script's usage was read by pydantic's coercion when it used only TurnUsage names:
    ``"input_tokens": "12"`` counted 12 tokens and ``true`` one, while the same map with one more
    key (or from the OpenAI-compatible agent) counted 0; ``12.5`` refused the whole script. A
    figure that is not a finite, non-negative number is not reported, whatever the map's keys."""
    from castor.actors.materia.socket_actor import usage_map
    from castor.domain.materia.budget import extract_usage

    for extra in ({}, {"note": "x"}):
        usage = {"input_tokens": figure, "output_tokens": 5, "cost_usd": figure, **extra}
        outcome = parse_script([{"text": "t", "usage": usage}]).by_socket["*"][0].outcome("t1")
        read = extract_usage(usage_map(outcome))
        cost = 12 if figure == "12" else 0  # a cost may be a decimal string; a token count may not
        assert (read.tokens.input, read.tokens.output, read.cost.total) == (0, 5, cost), (extra, read)
        assert outcome.usage.input_tokens is None and outcome.usage.output_tokens == 5
    fraction = parse_script([{"text": "t", "usage": {"input_tokens": 12.5, "cost_usd": "0.5"}}])
    read = extract_usage(usage_map(fraction.by_socket["*"][0].outcome("t1")))
    assert read.tokens.input == 12.5 and read.cost.total == 0.5  # counted as written, as pi-materia adds it
