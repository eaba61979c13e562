"""The extension's side of the castor contract, driven through real Pi.

castor here is the PROBE (tests/e2e/probe_castor.py): the real endpoint with scripted
handlers, so each harness method is checked before the actors are wired to it.
"""

from __future__ import annotations

import time

import psutil
import pytest

from tests.support.waiting import poll_until

from .conftest import read_jsonl, session_entries

pytestmark = [pytest.mark.pi, pytest.mark.timeout(60)]


def calls(log, method):
    return [c["params"] for c in read_jsonl(log) if c["method"] == method]


def events(log, name):
    return [c["data"] for c in calls(log, "harness.event") if c["event"] == name]


@pytest.fixture
def probe_pi(start_pi, probe_command):
    command, log = probe_command
    pi = start_pi(command, env={"CASTOR_PROBE_LOG": str(log)})
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("castor: up"))
    # "up" comes right after the handshake; session startup (open + session_start) follows it.
    deadline = time.monotonic() + 10
    while not events(log, "session_start"):
        assert time.monotonic() < deadline, "session_start never reached the probe"
        time.sleep(0.02)
    return pi, log


def test_session_open_and_lifecycle_events_reach_castor(probe_pi):
    pi, log = probe_pi
    pi.prompt("plain prompt")
    # agent_settled reaches castor just after Pi's own event (sent outside Pi's settle emission)
    assert poll_until(lambda: events(log, "agent_settled"), timeout=10)
    opened = calls(log, "session.open")
    assert len(opened) == 1 and opened[0]["session_id"] and opened[0]["cwd"].endswith("project")
    assert opened[0]["flags"]["has_agent_settled"] is True
    names = [c["event"] for c in calls(log, "harness.event")]
    for name in ["session_start", "before_agent_start", "context", "agent_end", "agent_settled"]:
        assert name in names, names
    assert names.index("before_agent_start") < names.index("agent_end") < names.index("agent_settled")
    before = events(log, "before_agent_start")[0]
    assert before["prompt"] == "plain prompt" and before["message_type"] == "user"


def test_injected_context_and_system_prompt_reach_the_model(probe_pi, fake_llm):
    pi, _ = probe_pi
    start = pi.prompt("PROBE inject remember-the-llama")
    request = fake_llm.log()[-1]
    assert request["messages"][0]["role"] == "system" and request["messages"][0]["content"].endswith("PROBE-SYS")
    contents = [str(m.get("content")) for m in request["messages"] if m["role"] == "user"]
    assert any("PROBE-CONTEXT remember-the-llama" in c for c in contents)
    end = pi.wait_for(lambda e: e.get("type") == "agent_end", start=start)
    assert "PROBE-CONTEXT remember-the-llama" in str(end["messages"])


def test_append_entry_is_acknowledged_and_lands_in_the_session_file(probe_pi, tmp_path):
    pi, log = probe_pi
    pi.prompt("PROBE audit")
    acks = calls(log, "ack")
    assert len(acks) == 1 and acks[0]["ok"] is True
    audits = [e for e in session_entries(tmp_path / "sessions") if e.get("customType") == "probe-audit"]
    assert [a["data"] for a in audits] == [{"version": 1, "n": 1}]


def test_an_entry_that_comes_past_its_expiry_is_refused_and_never_appended(probe_pi, tmp_path):
    pi, log = probe_pi
    pi.prompt("PROBE expiry")
    assert poll_until(lambda: len(calls(log, "expiry")) == 2, timeout=10)
    expired, in_time = calls(log, "expiry")
    assert (expired["custom_type"], expired["code"], expired["data"]["reason"]) == \
        ("probe-expired", "timeout", "expired")
    assert in_time["custom_type"] == "probe-in-time" and in_time["ack"]["ok"] is True
    kinds = [e.get("customType") for e in session_entries(tmp_path / "sessions")]
    assert "probe-in-time" in kinds and "probe-expired" not in kinds


def test_notify_and_status_from_castor_show_in_pi(probe_pi):
    pi, _ = probe_pi
    start = pi.prompt("PROBE notify")
    note = pi.wait_ui("notify", lambda e: e.get("message") == "probe says hi", start=start)
    assert note["notifyType"] == "warning"
    pi.wait_ui("setStatus", lambda e: e.get("statusKey") == "probe" and e.get("statusText") == "probe: on", start=start)


def test_run_turn_sends_a_hidden_isolated_prompt_and_reports_its_end(probe_pi, fake_llm):
    pi, log = probe_pi
    fake_llm.reply_text('{"ok": true}', when="TURN: HIDDEN-TURN-PROMPT")
    pi.prompt("PROBE turn HIDDEN-TURN-PROMPT")
    pi.wait_for(lambda e: e.get("type") == "agent_settled" and calls(log, "agent.turn_ended"), timeout=15)
    ended = calls(log, "agent.turn_ended")
    assert len(ended) == 1
    outcome = ended[0]
    assert outcome["turn_id"] == "probe-1" and outcome["text"] == '{"ok": true}'
    assert outcome["stop_reason"] == "stop" and outcome["error"] is None and outcome["aborted"] is False
    assert outcome["usage"]["input"] == 10 and outcome["usage"]["output"] == 5
    # each answer's usage map as Pi wrote it, and who answered (usage.json's model fields)
    [usage] = outcome["usages"]
    assert usage["input"] == 10 and usage["output"] == 5 and "totalFromProvider" in usage["cost"]
    assert set(outcome["model"]) == {"provider", "id", "api"} and all(outcome["model"].values()), outcome["model"]
    turn_request = next(r for r in fake_llm.log() if "TURN: HIDDEN-TURN-PROMPT" in str(r["messages"]))
    # isolate: the earlier user prompt is not part of the turn's context
    assert not any("PROBE turn" in str(m.get("content")) for m in turn_request["messages"]), turn_request["messages"]
    before = events(log, "before_agent_start")
    assert before[-1]["message_type"] == "custom" and before[-1]["turn_id"] == "probe-1"


def test_fabric_tool_round_trips_and_error_values_are_marked(probe_pi, fake_llm):
    pi, log = probe_pi
    fake_llm.reply_tool_call("probe_echo", {"text": "ping"})
    start = pi.prompt("use the tool")
    end = pi.wait_for(lambda e: e.get("type") == "tool_execution_end", start=start)
    assert end["isError"] is False and '"echo": "ping"' in str(end["result"])
    assert calls(log, "icarus.tool")[0]["name"] == "probe_echo"
    assert any("TOOL_RESULT_SEEN" in str(m) and "ping" in str(m) for m in pi.wait_for(
        lambda e: e.get("type") == "agent_end", start=start)["messages"])
    fake_llm.reply_tool_call("probe_echo", {"text": "bad"})
    start = pi.prompt("use the tool badly")
    end = pi.wait_for(lambda e: e.get("type") == "tool_execution_end", start=start)
    assert end["isError"] is True and "probe refused bad" in str(end["result"])


def test_model_list_and_classifier_complete_use_pis_registry(probe_pi, fake_llm):
    pi, log = probe_pi
    fake_llm.reply_text('{"keep": ["s1"]}', when="CLASSIFY ME")
    pi.prompt("PROBE models")
    models = calls(log, "model.list")[0]
    fake = [m for m in models["models"] if m["provider"] == "fake"]
    assert fake and fake[0]["id"] == "fake-model" and fake[0]["base_url"] == fake_llm.base_url
    assert models["current"] == {"provider": "fake", "id": "fake-model"}
    answer = calls(log, "classifier.complete")[0]
    assert answer["text"] == '{"keep": ["s1"]}' and answer["usage"]["input"] == 10
    classify_request = next(r for r in fake_llm.log() if "CLASSIFY ME" in str(r["messages"]))
    assert classify_request["messages"][0] == {"role": "system", "content": "classify"}


def test_commands_forward_and_unknown_subcommands_get_usage(probe_pi):
    pi, log = probe_pi
    start = pi.command("/materia cast build   a thing")
    pi.wait_ui("notify", lambda e: "probe cast.start" in e.get("message", ""), start=start)
    assert calls(log, "cast.start")[0]["request"] == "build a thing"
    start = pi.command("/materia frobnicate")
    note = pi.wait_ui("notify", lambda e: "Unknown /materia subcommand" in e.get("message", ""), start=start)
    assert note["notifyType"] == "warning"
    start = pi.command("/icarus  context   hide")
    pi.wait_ui("notify", lambda e: "probe icarus.command" in e.get("message", ""), start=start)
    assert calls(log, "icarus.command")[0]["args"] == "context hide"
    start = pi.command("/materia recast")  # not in the probe: castor's unknown_method comes back as an error toast
    note = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", start=start)
    assert "unknown_method" in note["message"]


def test_a_usage_error_says_what_was_wrong_on_one_short_line(probe_pi):
    pi, log = probe_pi
    start = pi.command("/materia abort   now")
    note = pi.wait_ui("notify", lambda e: "Usage: /materia" in e.get("message", ""), start=start)
    assert note["notifyType"] == "warning"
    assert note["message"].startswith('/materia abort takes no arguments (got "now").'), note["message"]
    start = pi.command("/materia " + "z" * 3000)
    note = pi.wait_ui("notify", lambda e: "Usage: /materia" in e.get("message", ""), start=start)
    assert note["message"].startswith(f'Unknown /materia subcommand "{"z" * 39}\u2026".'), note["message"][:120]
    assert len(note["message"]) < 400
    assert not calls(log, "cast.abort")


def test_dead_runtime_shows_an_error_pi_keeps_working_and_a_command_respawns(probe_pi, fake_llm):
    pi, log = probe_pi
    children = [
        p for p in psutil.Process(pi.proc.pid).children(recursive=True) if "probe_castor" in " ".join(p.cmdline())
    ]
    assert len(children) == 1
    start = pi.mark()
    children[0].kill()
    note = pi.wait_ui("notify", lambda e: e.get("notifyType") == "error", start=start)
    assert "castor runtime stopped" in note["message"]
    pi.wait_ui("setStatus", lambda e: e.get("statusText") == "castor: down", start=start)
    start = pi.prompt("no runtime now")  # lifecycle events fail fast; the prompt still completes
    assert "FAKE-REPLY: no runtime now" in str(
        pi.wait_for(lambda e: e.get("type") == "agent_end", start=start)["messages"]
    )
    start = pi.command("/materia status")
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("castor: up"), start=start)
    pi.wait_ui("notify", lambda e: "probe cast.status" in e.get("message", ""), start=start)
    assert len(calls(log, "session.open")) == 2  # the session was reopened on the new runtime


def test_an_argument_castor_refuses_is_named_with_what_lists_the_valid_ones(start_pi, castor_command):
    """A 3,000-character loadout name read only "materia: invalid params for grid.render"."""
    pi = start_pi(castor_command)
    pi.wait_ui("setStatus", lambda e: str(e.get("statusText", "")).startswith("castor: up"), timeout=30)
    start = pi.command("/materia grid " + "g" * 3000)
    note = pi.wait_ui("notify", lambda e: e.get("message", "").startswith("materia: "), start=start)
    assert note["notifyType"] == "warning", note
    assert note["message"].startswith("materia: castor refused the loadout name (3000 characters): "), note["message"]
    assert "/materia loadout lists the loadouts." in note["message"]
    start = pi.command("/materia revive " + "r" * 2000)
    note = pi.wait_ui("notify", lambda e: e.get("message", "").startswith("materia: "), start=start)
    assert "castor refused the cast id (2000 characters)" in note["message"] and "/materia casts" in note["message"]
