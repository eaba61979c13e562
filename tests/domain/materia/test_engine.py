"""Engine walk-throughs with scripted turn outcomes (spec §5–§8, conformance 38–82)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from castor.domain.materia.cast_messages import (
    EFFECT_ADAPTER,
    EVENT_ADAPTER,
    AbortRequested,
    CancelWork,
    Compact,
    CompactionFinished,
    ContinueRequested,
    DispatchFailed,
    Failed,
    Finished,
    RecastRequested,
    RefinementTurnStarted,
    ReviveRequested,
    RunAgentTurn,
    RunUtility,
    TurnEnded,
    UtilityFinished,
    WriteArtifact,
)
from castor.domain.materia.engine import CastRejected, step
from castor.domain.materia.revive import NotRevivable
from castor.domain.materia.state import CastState

from .scripted import Driver, config, resolved

ITEMS = {"workItems": [{"id": "alpha", "title": "Alpha"}, {"id": "beta", "title": "Beta"}]}


def build_driver(**kw: Any) -> Driver:
    d = Driver(resolved(None, "build"), **kw)
    d.utility({"ok": True, "added": []})  # Socket-1 project.ensureIgnored
    d.utility({"kind": "git", "root": "/w"})  # Socket-2 vcs.detect
    return d


# ----------------------------------------------------------------------------- bundled loadouts


def test_build_loop_with_rework_runs_to_summary() -> None:
    d = build_driver()
    assert d.state.data["vcs"] == {"kind": "git", "root": "/w"}
    assert d.pending().socket_id == "Socket-3"
    d.reply(ITEMS, usage={"inputTokens": 10, "outputTokens": 5})
    seen = []
    script = ["did alpha", {"satisfied": False, "feedback": "tests fail"}, "fixed alpha", {"satisfied": True},
              "did beta", {"satisfied": True}, "All done."]
    for reply in script:
        work = d.pending()
        seen.append((work.socket_id, work.item_key))
        if (work.socket_id, work.item_key) == ("Socket-4", "alpha") and seen.count(("Socket-4", "alpha")) == 2:
            assert "tests fail" in work.prompt  # rework sees the reviewer's feedback
        d.reply(reply)
    assert seen == [("Socket-4", "alpha"), ("Socket-5", "alpha"), ("Socket-4", "alpha"), ("Socket-5", "alpha"),
                    ("Socket-4", "beta"), ("Socket-5", "beta"), ("Socket-7", None)]
    s = d.state
    assert s.phase == "complete" and not s.active and s.socket_state == "complete"
    assert s.visits == {"Socket-1": 1, "Socket-2": 1, "Socket-3": 1, "Socket-4": 3, "Socket-5": 3, "Socket-6": 2,
                        "Socket-7": 1}
    assert s.edge_traversals["Socket-5->Socket-4"] == 1 and s.edge_traversals["Socket-6->Socket-4"] == 1
    assert s.cursors["workItemIndex"] == 2
    assert s.task_attempts[json.dumps(["Socket-4", "alpha"], separators=(",", ":"))] == 2
    assert "item" not in s.data  # deliberate: no stale item after the loop
    arts = d.artifacts()
    for path in ("sockets/Socket-4/1-alpha.md", "sockets/Socket-4/2-alpha.md", "sockets/Socket-4/3-beta.md",
                 "sockets/Socket-5/1.json", "contexts/Socket-4-alpha-1.md", "sockets/Socket-1/1.input.json",
                 "config.resolved.json", "manifest.json", "usage.json"):
        assert path in arts, path
    assert "# Materia Isolated Context" in arts["contexts/Socket-4-alpha-1.md"].content
    assert "## Hidden materia prompt" in arts["contexts/Socket-4-alpha-1.md"].content
    end = d.events("cast_end")[-1]
    assert end.data["ok"] is True and end.data["usage"]["tokens"]["total"] == 15
    assert isinstance(d.effects[-1], Finished)
    types = d.event_types()
    assert types[0] == "cast_start" and types[-1] == "cast_end"
    assert types.count("socket_start") == sum(s.visits.values())


def test_empty_work_items_still_reach_summary() -> None:
    d = build_driver()
    d.reply({"workItems": []})
    work = d.pending()
    assert work.socket_id == "Socket-7"  # the bundled loop's always exit route from Socket-4
    assert d.state.visits.get("Socket-4") is None
    assert "Socket-4" not in [e.data["socket"] for e in d.events("socket_start")]


def test_rework_edge_limit_fails_cast() -> None:
    d = build_driver()
    d.reply({"workItems": [{"id": "a"}]})
    for _ in range(6):
        d.reply("try")
        d.reply({"satisfied": False})
    d.reply("try")
    tr = d.reply({"satisfied": False})
    assert d.state.phase == "failed"
    assert "edge traversal limit exceeded for Socket-5->Socket-4 (7/6)" in d.state.failed_reason
    assert any(isinstance(e, Failed) and not e.revivable for e in tr.effects)


def test_33_visit_limit_fails_cast() -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "A", "parse": "json", "limits": {"maxVisits": 1},
                               "edges": [{"when": "not_satisfied", "to": "Socket-1"}]}})
    d = Driver(resolved(cfg))
    d.reply({"satisfied": False})
    assert d.state.phase == "failed"
    assert d.state.failed_reason == "Materia socket visit limit exceeded for Socket-1 (2/1)."


def test_a_runaway_usage_report_warns_with_a_readable_percentage() -> None:
    from castor.domain.materia.cast_messages import Notify

    cfg = config({"Socket-1": {"type": "agent", "materia": "A"}},
                 budget={"maxTokens": 100, "warnAtPercent": 50, "stopAtLimit": False})
    d = Driver(resolved(cfg))
    d.reply("one", usage={"total": 1e300})
    texts = [e.message for e in d.effects if isinstance(e, Notify) and "budget at" in e.message]
    assert texts == ["pi-materia budget at over 10000%"], texts


def test_budget_warns_once_then_stops() -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "A", "edges": [{"to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "A", "edges": [{"to": "Socket-3"}]},
                  "Socket-3": {"type": "agent", "materia": "A"}},
                 budget={"maxTokens": 100, "warnAtPercent": 50})
    d = Driver(resolved(cfg))
    d.reply("one", usage={"total": 60})
    assert len(d.events("budget_warning")) == 1 and d.state.active
    d.reply("two", usage={"total": 30})
    assert len(d.events("budget_warning")) == 1
    d.reply("three", usage={"total": 30})
    assert d.events("budget_limit")[-1].data["overToken"] is True
    assert d.state.failed_reason == "pi-materia budget limit reached"
    assert d.event_types()[-1] == "cast_end"
    assert d.events("socket_complete")[-1].data["socket"] == "Socket-3"  # checked after completion


def test_budget_without_stop_only_notifies() -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "A"}}, budget={"maxTokens": 1, "stopAtLimit": False})
    d = Driver(resolved(cfg))
    d.reply("x", usage={"total": 5})
    assert d.state.phase == "complete" and len(d.events("budget_limit")) == 1


def test_a_recast_keeps_what_a_budget_stopped_cast_spent_and_says_first_that_it_stops_again() -> None:
    from castor.domain.materia.cast_messages import Notify
    from castor.domain.materia.engine import BUDGET_LIMIT_REACHED, BUDGET_RECAST_NOTE

    cfg = config({"Socket-1": {"type": "agent", "materia": "A", "edges": [{"to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "A", "edges": [{"to": "Socket-3"}]},
                  "Socket-3": {"type": "agent", "materia": "A"}},
                 budget={"maxTokens": 100})
    d = Driver(resolved(cfg))
    d.reply("one", usage={"total": 60})
    d.reply("two", usage={"total": 60})
    assert d.state.failed_reason == BUDGET_LIMIT_REACHED
    tr = d.send(RecastRequested)
    notes = [e.message for e in tr.effects if isinstance(e, Notify) and e.level == "warning"]
    assert notes == ["pi-materia budget: cast cast-1 has already reached its budget (120 tokens of budget.maxTokens "
                     f"100): {BUDGET_RECAST_NOTE}"]
    # as pi-materia: the spent amount is kept, the cast goes on, and the next check stops it again
    assert d.state.active and d.state.usage.tokens.total == 120
    d.reply("three", usage={"total": 1})
    assert d.state.failed_reason == BUDGET_LIMIT_REACHED and d.state.usage.tokens.total == 121


@pytest.mark.parametrize("error", ["maximum tokens exceeded before response", "WebSocket closed"])
def test_a_failed_turn_whose_usage_reaches_the_budget_stops_the_cast_instead_of_a_paid_retry(error: str) -> None:
    """A context-window failure is retried at the same socket, a transient one by the harness: each
    retry is paid for. With the budget spent (the failed turn's usage counts), the cast stops there."""
    from castor.domain.materia.engine import BUDGET_LIMIT_REACHED

    cfg = config({"Socket-1": {"type": "agent", "materia": "A"}}, budget={"maxTokens": 100})
    d = Driver(resolved(cfg))
    d.fail_turn(error, usage={"input": 150})
    assert d.state.failed_reason == BUDGET_LIMIT_REACHED and not d.state.active
    assert d.events("budget_limit")[-1].data["overToken"] is True
    assert "same_socket_recovery_retry" not in d.event_types()
    assert "transient_transport_turn_failure" not in d.event_types()


@pytest.mark.parametrize("error", ["maximum tokens exceeded before response", "WebSocket closed"])
def test_a_failed_turn_under_the_budget_is_retried_as_before(error: str) -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "A"}}, budget={"maxTokens": 100})
    d = Driver(resolved(cfg))
    d.fail_turn(error, usage={"input": 50})
    assert d.state.active and not d.events("budget_limit")


def test_a_recast_under_the_budget_says_nothing_of_it() -> None:
    from castor.domain.materia.cast_messages import Notify

    cfg = config({"Socket-1": {"type": "agent", "materia": "A"}}, budget={"maxTokens": 100})
    d = Driver(resolved(cfg))
    d.send(AbortRequested)
    tr = d.send(RecastRequested)
    assert not [e for e in tr.effects if isinstance(e, Notify) and "budget" in e.message]


# ----------------------------------------------------------------------------- multi-turn


def test_48_to_51_multi_turn_plan_loadout() -> None:
    d = Driver(resolved(None, "plan"))
    first = d.pending()
    assert first.mode == "refinement" and "refinement conversation" in first.prompt
    assert "Return only JSON" not in first.prompt
    d.reply({"workItems": [{"id": "x"}], "satisfied": True})
    s = d.state
    assert s.socket_state == "awaiting_user_refinement" and not s.awaiting_response
    assert s.last_json is None and "workItems" not in s.data
    assert "sockets/Socket-1/1.refinement-1-" in " ".join(d.artifacts())
    dup = step(s, TurnEnded(visit_id=first.visit_id, text="dup", at=99))  # a duplicate delivery
    assert dup.state.multi_turn_refinements == s.multi_turn_refinements
    assert [e.type for e in dup.events()] == ["outcome_ignored"]


def test_refinement_turns_and_continue_finalizes() -> None:
    d = Driver(resolved(None, "plan"))
    d.reply("What stack do you use?")
    assert d.state.paused
    d.send(RefinementTurnStarted)
    turn = d.pending()
    assert turn.user_driven and turn.mode == "refinement" and "Previous output:\nWhat stack do you use?" in turn.prompt
    assert d.events("context_refinement")
    d.reply("Proposed: two items")
    key = json.dumps(["Socket-1", "__singleton__", 1], separators=(",", ":"))
    assert d.state.multi_turn_refinements[key] == 2 and not d.state.multi_turn_finalizing
    d.send(ContinueRequested)
    fin = d.pending()
    assert d.state.multi_turn_finalizing and d.state.awaiting_response
    assert "Command-triggered finalization" in fin.prompt and "Return only JSON" in fin.prompt
    with pytest.raises(CastRejected) as err:
        d.send(ContinueRequested)
    assert "already awaiting a Pi agent response" in err.value.message
    d.reply({"workItems": [{"id": "a", "title": "A"}]})
    out = d.artifacts()["sockets/Socket-1/1.md"].manifest
    assert out["kind"] == "socket_output" and out["finalized"] is True and out["refinementTurn"] == 2
    complete = d.events("socket_complete")[-1].data
    assert complete["finalizedRefinement"] is True
    assert d.state.data["workItems"] == [{"id": "a", "title": "A"}]
    assert d.pending().socket_id == "Socket-2"


def test_invalid_final_json_fails_and_continue_on_inactive_is_rejected() -> None:
    d = Driver(resolved(None, "plan"))
    d.reply("draft")
    d.send(ContinueRequested)
    d.reply("no json here")
    assert 'Invalid JSON output for socket "Socket-1"' in d.state.failed_reason
    with pytest.raises(CastRejected):
        d.send(ContinueRequested)


# ----------------------------------------------------------------------------- single-socket shapes


def test_46_json_then_text_and_85_text_prompt() -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "J", "parse": "json", "edges": [{"to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "A"}})
    d = Driver(resolved(cfg))
    assert "Return only JSON" in d.pending().prompt
    d.reply('Here you go ```json\n{"summary": "s", "guidance": {"g": 1}}\n```')
    s = d.state
    assert s.current_socket_id == "Socket-2" and s.awaiting_response and len(d.turns()) == 2
    text_prompt = d.pending().prompt
    assert "<materia-instructions>" in text_prompt and "Socket adapter context" in text_prompt
    assert "Current workItem JSON: null" in text_prompt and '"g": 1' in text_prompt
    assert "Return only JSON" not in text_prompt


def test_77_echo_utility_runs_inline() -> None:
    cfg = config({"Socket-1": {"type": "utility", "utility": "echo", "params": {"text": "HELLO WORLD"}}})
    d = Driver(resolved(cfg))
    s = d.state
    assert s.phase == "complete" and s.last_output == "HELLO WORLD" and not d.turns()
    assert d.artifacts()["sockets/Socket-1/1.md"].content == "HELLO WORLD"


@pytest.mark.parametrize(("params", "output"), [
    ({"output": {"name": "café 你好", "n": 1.0}}, '{"name":"café 你好","n":1}'),  # JSON.stringify's text
    ({"text": None, "message": "m"}, "m"),  # text ?? message: a null is as absent
    ({"text": None}, ""),
    ({"text": ["a", 2]}, '["a",2]'),
])
def test_echo_writes_what_pi_materia_writes(params: dict, output: str) -> None:
    """Non-ASCII text came out escaped (caf\\u00e9) and a null text as "null"."""
    from castor.adapters.materia.builtins import run_builtin

    d = Driver(resolved(config({"Socket-1": {"type": "utility", "utility": "echo", "params": params}})))
    assert d.state.phase == "complete" and d.state.last_output == output
    assert run_builtin("echo", params, cwd=".") == output  # the pool's built-in says the same


def test_manifest_entries_carry_pi_materia_s_entry_ids_and_epoch_millisecond_timestamps() -> None:
    """pi-materia names a command's three entries ``utility:<id>:<visit>:command:stdout`` /
    ``:command:stderr`` / ``:command:meta`` and stamps every entry with ``Date.now()``; castor wrote
    ``:stdout`` / ``:stderr`` / ``:command`` and an ISO string, so a reader of either failed on the other."""
    d = Driver(resolved(config({"Socket-1": {"type": "utility", "command": ["tool"]}})))
    d.utility("out", exit_code=0)
    entries = [e.manifest for e in d.artifacts().values() if e.manifest is not None]
    ids = [e["entryId"] for e in entries if "command" in e["artifact"]]
    assert ids == ["utility:Socket-1:1:command:stdout", "utility:Socket-1:1:command:stderr",
                   "utility:Socket-1:1:command:meta"], ids
    assert all(type(e["timestamp"]) is int for e in entries), entries  # milliseconds of the step's clock


def test_whole_numbers_are_written_as_javascript_writes_them() -> None:
    """usage.json's counts (120.0), a command's timeoutMs (30000.0) and a budget's limits (300.0)
    came out as floats where pi-materia writes 120, 30000 and 300."""
    from castor.domain.materia.cast_messages import EmitEvent

    cfg = config({"Socket-1": {"type": "utility", "command": ["tool"], "edges": [{"when": "always", "to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "A"}})
    cfg["budget"] = {"maxTokens": 100, "warnAtPercent": 50}
    d = Driver(resolved(cfg))
    d.utility("out", exit_code=0)
    d.reply("done", usage={"input": 120, "output": 3.0})
    usage = d.artifacts()["usage.json"].content
    assert '"input": 120,' in usage and '"output": 3,' in usage and ".0," not in usage, usage
    events = {e.type: e.data for e in d.effects if isinstance(e, EmitEvent)}
    assert type(events["utility_command"]["timeoutMs"]) is int
    limit = events["budget_limit"]
    assert '100.0' not in json.dumps(limit) and limit["usage"]["tokens"]["total"] == 123


def test_usage_names_the_selected_model_until_an_answer_names_its_own() -> None:
    """pi-materia copies a selection's model, provider and thinking to usage.json's top level, keys a
    selection by its task and attempt, and gives each turn the selection's fields under the answer's
    own: castor left the top level null and the turns without ``thinking`` or the selection's fields."""
    from .scripted import agent

    cfg = config({"Socket-1": {"type": "agent", "materia": "M", "edges": [{"when": "always", "to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "M"}},
                 materia={"M": agent(model="anthropic/claude-sonnet-4-5", thinking="medium")})
    d = Driver(resolved(cfg))
    d.reply("one", usage={"input": 100, "output": 50})
    report = d.state.usage
    assert (report.model, report.provider, report.thinkingLevel) == ("claude-sonnet-4-5", "anthropic", "medium")
    first = report.turns[0]
    assert (first.model, first.provider, first.thinking) == ("claude-sonnet-4-5", "anthropic", "medium")
    assert first.requestedModel == "anthropic/claude-sonnet-4-5" and first.source == "configured"
    assert report.modelSelections[0]["attempt"] == 1
    d.reply("two", usage={"input": 1, "output": 1}, model="gpt-5", provider="openai")  # the answer names its own
    assert (report := d.state.usage).turns[1].model == "gpt-5" and report.model == "gpt-5"
    assert report.provider == "openai" and report.turns[1].thinking == "medium"


@pytest.mark.parametrize(("model", "thinking", "expected"), [
    ("anthropic/claude-test", "high", {"model": "claude-test", "provider": "anthropic", "thinking": "high",
                                       "label": "anthropic/claude-test", "source": "configured"}),
    ("   ", None, {"label": "active Pi model", "source": "active"}),
    (None, "max", {"requestedThinking": "max", "thinkingFallbackReason": "unknown_thinking", "source": "active"}),
])
def test_events_manifest_and_usage_carry_one_materia_model_record(model: str | None, thinking: str | None,
                                                                  expected: dict[str, Any]) -> None:
    """pi-materia writes one ``MateriaModelSelection`` as events' and manifest entries'
    ``materiaModel`` and as usage.json's ``modelSelections``: castor's events and manifest carried
    a smaller record whose ``model`` was ``anthropic/claude-test`` and that had no ``provider``."""
    from .scripted import agent

    extra = {k: v for k, v in (("model", model), ("thinking", thinking)) if v is not None}
    cfg = config({"Socket-1": {"type": "agent", "materia": "M"}}, materia={"M": agent(**extra)})
    d = Driver(resolved(cfg))
    d.reply("done", usage={"input": 1, "output": 1})
    (selection,) = d.state.usage.modelSelections
    record = {k: v for k, v in selection.items() if k not in ("socket", "materia", "visit", "attempt")}
    assert record.items() >= expected.items()
    # a field with no value is left out everywhere, as pi-materia's JSON leaves out what is undefined
    assert None not in record.values()
    if model is None or not model.strip():
        assert "model" not in record and "provider" not in record and "thinking" not in record
    (settings,) = d.events("materia_model_settings")
    (complete,) = d.events("socket_complete")
    entries = [a.manifest for a in d.effects if isinstance(a, WriteArtifact) and a.manifest
               and "materiaModel" in a.manifest]
    assert entries and all(entry["materiaModel"] == record for entry in entries)
    assert settings.data["materiaModel"] == record and complete.data["materiaModel"] == record


@pytest.mark.parametrize("model", [None, "", "   "])
def test_a_blank_materia_model_is_the_active_model_in_the_context_artifact(model: str | None) -> None:
    """A blank model ("   ") is unset everywhere; the context artifact printed it as ``- model: ``."""
    from .scripted import agent

    cfg = config({"Socket-1": {"type": "agent", "materia": "M"}},
                 materia={"M": agent(**({} if model is None else {"model": model}))})
    d = Driver(resolved(cfg))
    lines = d.artifacts()["contexts/Socket-1-1.md"].content.splitlines()
    assert "model: active Pi model" in lines and "model source: active Pi model fallback" in lines


def test_the_context_artifact_header_is_written_as_pi_materia_writes_it() -> None:
    """Plain ``name: value`` lines (no list bullets), pi-materia's source wording and
    ``toISOString`` time (milliseconds): the header read by a script written for pi-materia's runs."""
    import re

    from .scripted import agent

    cfg = config({"Socket-1": {"type": "agent", "materia": "M", "edges": [{"when": "always", "to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "N"}},
                 materia={"M": agent(model="anthropic/claude-test", thinking="high", tools="readOnly"),
                          "N": agent()})
    d = Driver(resolved(cfg))
    d.reply("one")
    configured = d.artifacts()["contexts/Socket-1-1.md"].content.splitlines()
    active = d.artifacts()["contexts/Socket-2-1.md"].content.splitlines()
    assert configured[:2] == ["# Materia Isolated Context", ""]
    assert [line.split(": ", 1)[0] for line in configured[2:13]] == [
        "cast", "socket", "materia", "item", "visit", "model", "model source", "thinking", "thinking source",
        "active tools", "timestamp"]
    assert "model: anthropic/claude-test" in configured and "model source: configured materia setting" in configured
    assert "thinking: high" in configured and "thinking source: configured materia setting" in configured
    assert "model source: active Pi model fallback" in active
    assert "thinking source: active Pi thinking fallback" in active
    # The tool names the turn runs with, as pi-materia lists them (not the scope's name).
    assert "active tools: read, grep, find, ls" in configured, configured
    assert "active tools: all of the host's tools (coding)" in active, active
    (stamp,) = [line for line in configured if line.startswith("timestamp: ")]
    assert re.fullmatch(r"timestamp: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp), stamp


def test_81_command_utility_input_and_78_80_failures() -> None:
    cfg = config({"Socket-1": {"type": "utility", "command": ["tool", "--x"], "timeoutMs": 50,
                               "params": {"p": 1}}})
    d = Driver(resolved(cfg), request="req")
    work = d.pending()
    assert isinstance(work, RunUtility) and work.command == ("tool", "--x") and work.timeout_ms == 50
    stdin = work.stdin_json
    assert stdin["cwd"] == "/w" and stdin["runDir"] == "/w/run" and stdin["request"] == "req"
    assert stdin["socketId"] == "Socket-1" and stdin["params"] == {"p": 1} and stdin["state"] == {}
    assert stdin["item"] is None and stdin["itemKey"] is None and stdin["itemLabel"] is None
    d.utility("", stderr="bad thing\n", exit_code=7)
    msg = d.state.failed_reason
    assert "exited with code 7" in msg and "bad thing" in msg and "sockets/Socket-1/1.command.stdout.txt" in msg
    assert d.artifacts()["sockets/Socket-1/1.command.stderr.txt"].content == "bad thing\n"
    assert d.events("utility_command")[0].data["code"] == 7

    d2 = Driver(resolved(cfg))
    d2.utility("", timed_out=True, exit_code=None, signal="SIGKILL")
    assert "timed out" in d2.state.failed_reason and "50ms" in d2.state.failed_reason
    d3 = Driver(resolved(cfg))
    d3.utility("x" * 10, stdout_truncated=True)
    meta = json.loads(d3.artifacts()["sockets/Socket-1/1.command.json"].content)
    assert meta["stdoutTruncated"] is True and meta["stderrTruncated"] is False
    assert d3.state.phase == "complete"
    d4 = Driver(resolved(cfg))
    d4.utility("", spawn_error="No such file: tool")
    assert "failed to start" in d4.state.failed_reason
    assert not any(p.startswith("sockets/Socket-1/1.command") for p in d4.artifacts())


def test_unknown_utility_alias_fails_cleanly_at_start() -> None:
    d = Driver(resolved(config({"Socket-1": {"type": "utility", "utility": "teleport"}})))
    assert d.state.phase == "failed"
    assert 'Unknown utility alias "teleport" for socket "Socket-1".' == d.state.failed_reason


def test_41_42_foreach_items_and_attempts() -> None:
    cfg = config({
        "Socket-1": {"type": "agent", "materia": "J", "parse": "json",
                     "foreach": {"items": "state.list", "cursor": "i"},
                     "advance": {"cursor": "i", "items": "state.list", "when": "$.done == true"},
                     "edges": [{"when": "always", "to": "Socket-1"}]}})
    cfg["loadouts"]["L"]["sockets"]["Socket-1"]["advance"]["done"] = "Socket-2"
    cfg["loadouts"]["L"]["sockets"]["Socket-2"] = {"type": "agent", "materia": "A"}
    d2 = Driver(resolved(cfg), data={"list": [{"id": "a", "title": "Alpha"}, {"id": "b", "title": "Beta"}]})
    keys = []
    for done in (False, True, True):
        keys.append((d2.state.current_item_key, d2.state.current_item_label))
        d2.reply({"done": done}, usage={"total": 1})
    assert keys == [("a", "Alpha"), ("a", "Alpha"), ("b", "Beta")]
    assert d2.pending().socket_id == "Socket-2"
    d2.reply("end", usage={"total": 1})
    turns = [(t.socket, t.taskId, t.attempt) for t in d2.state.usage.turns]
    assert turns == [("Socket-1", "a", 1), ("Socket-1", "a", 2), ("Socket-1", "b", 1), ("Socket-2", None, 1)]
    assert sorted(d2.state.usage.byAttempt) == ["a:1", "a:2", "b:1"]
    assert "sockets/Socket-1/1-a.md" in d2.artifacts() and "sockets/Socket-1/3-b.md" in d2.artifacts()


def test_41_an_items_label_is_title_then_name_then_its_key_as_pi_materia_names_it() -> None:
    """An item with an id but no title/name had no label (a command read ``itemLabel: null``), and
    an item with both ``id`` and ``key`` was labelled by its ``key``."""
    cfg = config({"Socket-1": {"type": "utility", "command": ["tool"],
                               "foreach": {"items": "state.list", "cursor": "i"},
                               "advance": {"cursor": "i", "items": "state.list"},
                               "edges": [{"when": "always", "to": "Socket-1"}]}})
    items = [{"id": "w1"}, {"id": "w2", "key": "k2"}, "plain", {"key": "k4", "name": "Fourth"}, {"id": 5, "title": 7}]
    d = Driver(resolved(cfg), data={"list": items})
    seen = []
    for _ in items:
        stdin = d.pending().stdin_json
        seen.append((stdin["itemKey"], stdin["itemLabel"]))
        d.utility("ok")
    assert seen == [("w1", "w1"), ("w2", "w2"), ("2", "2"), ("k4", "Fourth"), ("5", "7")]
    assert [(e.data["itemKey"], e.data["itemLabel"]) for e in d.events("socket_complete")] == seen
    assert d.state.phase == "complete"


@pytest.mark.parametrize("items", ["lastJson.files", "$.files", "state.files"])
def test_foreach_items_read_the_last_json_reply(items: str) -> None:
    """A loop's items written as ``lastJson.x`` (or ``$.x``: with no reply parsed yet at the
    socket's start, ``$`` is the last JSON reply) iterated nothing: the socket was skipped and the
    cast completed having done nothing."""
    cfg = config({
        "Socket-1": {"type": "agent", "materia": "J", "parse": "json", "assign": {"files": "$.files"},
                     "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "A", "foreach": {"items": items, "done": "end"},
                     "advance": {"cursor": "Socket-2Index", "items": "state.files"},
                     "edges": [{"when": "always", "to": "Socket-2"}]}})
    d = Driver(resolved(cfg))
    d.reply({"files": ["a", "b"]}, usage={"total": 1})
    seen = []
    while d.state.phase not in ("complete", "failed"):
        seen.append(d.state.data.get("item"))
        d.reply(f"did {d.state.data.get('item')}", usage={"total": 1})  # text: lastJson stays
    assert seen == ["a", "b"] and d.state.phase == "complete", (seen, d.state.failed_reason)


def test_a_loop_s_own_name_for_its_item_does_not_outlive_the_loop() -> None:
    """castor drops ``item`` / ``currentWorkItem`` / ``workItem`` when a non-loop socket starts (no
    stale item leaks into it), but a loop's ``as`` name kept the last item; a key of the same name
    that holds other data stays."""
    cfg = config({
        "Socket-1": {"type": "agent", "materia": "A",
                     "foreach": {"items": "state.files", "as": "file", "done": "Socket-2"},
                     "advance": {"cursor": "Socket-1Index", "items": "state.files", "done": "Socket-2"},
                     "edges": [{"when": "always", "to": "Socket-1"}]},
        "Socket-2": {"type": "agent", "materia": "A"}})
    d = Driver(resolved(cfg), data={"files": ["a", "b"]})
    d.reply("did a")
    assert d.state.data["file"] == "b"
    d.reply("did b")
    assert d.pending().socket_id == "Socket-2" and "file" not in d.state.data and "item" not in d.state.data
    kept = Driver(resolved(cfg), data={"files": [], "file": "notes.md"})  # an empty loop: "file" is data
    assert kept.pending().socket_id == "Socket-2" and kept.state.data["file"] == "notes.md"


# ----------------------------------------------------------------------------- failure classes


def test_54_context_window_compacts_and_retries_same_visit() -> None:
    d = Driver(resolved(None, "hello"))
    first = d.pending()
    d.fail_turn("context window exceeded", usage={"total": 3})
    compact = d.pending()
    assert isinstance(compact, Compact) and compact.reason == "context_window"
    assert d.events("same_socket_recovery_start")[0].data["mode"] == "normal"
    d.compacted(result={"tokensBefore": 10, "tokensAfter": 2, "junk": 1})
    retry = d.pending()
    assert isinstance(retry, RunAgentTurn) and retry.recovery and not retry.proactive_compaction
    assert retry.prompt == first.prompt and retry.visit_id != first.visit_id
    assert d.events("same_socket_recovery_action_complete")[0].data["result"] == {"tokensBefore": 10, "tokensAfter": 2}
    assert len(d.events("same_socket_recovery_retry")) == 1
    assert d.state.visits == {"Socket-1": 1} and len(d.events("socket_start")) == 1
    d.reply("hi")
    assert d.state.phase == "complete"


def test_55_65_66_exhaustion_then_revive() -> None:
    d = Driver(resolved(None, "hello"))
    d.fail_turn("context window exceeded")
    d.compacted()
    d.fail_turn("context window exceeded")
    s = d.state
    assert s.phase == "failed" and "Same-socket recovery exhausted" in s.failed_reason
    ex = s.recovery_exhaustion
    assert (ex.attempts, ex.original_max_attempts, ex.effective_max_attempts, ex.revive_count) == (1, 1, 1, 0)
    assert ex.failed_reason == s.failed_reason
    assert [e for e in d.effects if isinstance(e, Failed)][-1].revivable
    d.send(ReviveRequested)
    types = d.event_types()
    assert types.index("cast_revive") < types.index("cast_recast")
    revive = d.events("cast_revive")[0].data
    assert (revive["priorEffectiveMaxAttempts"], revive["increment"], revive["newEffectiveMaxAttempts"]) == (1, 1, 2)
    s = d.state
    assert s.active and s.awaiting_response and s.recovery_exhaustion is None
    assert d.events("cast_recast")[-1].data["reusedActivePrompt"] is True
    assert s.visits == {"Socket-1": 1}
    # one more context_window is now allowed: it compacts again instead of failing
    d.fail_turn("context window exceeded")
    assert isinstance(d.pending(), Compact)
    d.compacted()
    d.fail_turn("context window exceeded")
    d.send(ReviveRequested)
    assert d.events("cast_revive")[-1].data["newEffectiveMaxAttempts"] == 3
    assert d.events("cast_revive")[-1].data["reviveCount"] == 2


def test_56_error_without_output_recovers() -> None:
    d = Driver(resolved(None, "hello"))
    d.fail_turn("maximum tokens exceeded before response")
    assert isinstance(d.pending(), Compact)
    assert "before producing an assistant response" in d.events("same_socket_recovery_start")[0].data["error"]


def test_57_58_transient_transport_keeps_waiting() -> None:
    d = Driver(resolved(None, "hello"))
    work = d.pending()
    d.fail_turn("WebSocket error", entry_id="e1")
    s = d.state
    assert s.active and s.awaiting_response and s.pending.visit_id == work.visit_id
    ev = d.events("transient_transport_turn_failure")[0].data
    assert ev["warning"] is True and ev["entryId"] == "e1"
    assert not d.events("cast_end") and not any(isinstance(e, Compact) for e in d.effects)
    assert len(d.turns()) == 1  # nothing resent
    d.send(TurnEnded, visit_id=work.visit_id, text="hello!", entry_id="e2")
    assert d.state.phase == "complete" and d.events("cast_end")[0].data == {**d.events("cast_end")[0].data,
                                                                             "ok": True, "entryId": "e2"}


def test_stream_ended_is_transient_but_embedded_provider_error_is_terminal() -> None:
    d = Driver(resolved(None, "hello"))
    d.fail_turn("Stream ended without finish_reason")
    assert d.state.active and d.events("transient_transport_turn_failure")
    d2 = Driver(resolved(None, "hello"))
    d2.fail_turn('Codex error: {"type":"error","message":"boom"} stream ended without finish_reason', text="partial")
    assert d2.state.phase == "failed" and "Non-recoverable turn failure" in d2.state.failed_reason


def test_59_non_recoverable() -> None:
    for message in ("provider auth failed", "invalid_request_error: bad"):
        d = Driver(resolved(None, "hello"))
        d.fail_turn(message)
        assert not any(isinstance(e, Compact) for e in d.effects)
        assert "Non-recoverable turn failure" in d.state.failed_reason and message in d.state.failed_reason
        assert not d.state.recovery_exhaustion


def test_60_compaction_failure_fails_not_revivable() -> None:
    d = Driver(resolved(None, "hello"))
    d.fail_turn("context window exceeded")
    d.compacted(ok=False, error="host said no")
    assert "Same-socket recovery action compact failed" in d.state.failed_reason
    assert d.events("same_socket_recovery_action_failed")
    with pytest.raises(NotRevivable):
        d.send(ReviveRequested)


def test_tool_timeout_retries_three_times_without_compaction() -> None:
    d = Driver(resolved(None, "hello"))
    for attempt in (1, 2, 3):
        d.fail_turn("bash timed out after 30s")
        assert isinstance(d.pending(), RunAgentTurn) and d.pending().recovery
        assert d.events("same_socket_recovery_retry")[-1].data["attempt"] == attempt
    d.fail_turn("bash timed out after 30s")
    assert d.state.recovery_exhaustion.reason == "tool_timeout"
    assert not any(isinstance(e, Compact) for e in d.effects)


def test_generic_turn_failure_retries_once_without_compaction() -> None:
    d = Driver(resolved(None, "hello"))
    d.fail_turn("upstream overloaded, try again")
    assert d.pending().recovery and not any(isinstance(e, Compact) for e in d.effects)
    d.reply("ok")
    assert d.state.phase == "complete"
    d2 = Driver(resolved(None, "hello"))
    d2.fail_turn("upstream overloaded", text="half an answer")  # produced output: not the safe generic class
    assert "Non-recoverable" in d2.state.failed_reason


def test_63_refinement_retry_keeps_last_good_draft() -> None:
    d = Driver(resolved(None, "plan"))
    d.reply("Draft one")
    d.send(RefinementTurnStarted)
    d.fail_turn("context window exceeded", text="broken partial")
    d.compacted()
    retry = d.pending()
    assert retry.mode == "refinement" and "Previous output:\nDraft one" in retry.prompt
    assert "broken partial" not in retry.prompt


def test_64_foreach_retry_keeps_cursor_and_visits() -> None:
    d = build_driver()
    d.reply(ITEMS)
    d.reply("built alpha")
    before = (dict(d.state.cursors), d.state.current_item_key, dict(d.state.task_attempts), dict(d.state.visits))
    d.fail_turn("context window exceeded")
    d.compacted()
    assert (
        dict(d.state.cursors),
        d.state.current_item_key,
        dict(d.state.task_attempts),
        dict(d.state.visits),
    ) == before
    d.reply({"satisfied": True})
    assert d.pending().item_key == "beta" and d.state.visits["Socket-4"] == 2


# ----------------------------------------------------------------------------- duplicates, abort, recast


def test_duplicate_and_stale_outcomes_are_ignored() -> None:
    d = Driver(resolved(None, "build"))
    util = d.pending()
    d.utility({"ok": True})
    before = d.state
    tr = d.send(UtilityFinished, visit_id=util.visit_id, stdout="{}")
    assert tr.state.model_dump() == {**before.model_dump(), "updated_at": tr.state.updated_at}
    ignored = d.events("outcome_ignored")[-1].data
    assert ignored["reason"] == "not-current-visit" and ignored["visitId"] == util.visit_id
    tr = d.send(TurnEnded, visit_id="bogus", text="x")
    assert d.events("outcome_ignored")[-1].data["expected"] == d.state.pending.visit_id
    assert d.state.visits == {"Socket-1": 1, "Socket-2": 1}


def test_abort_then_late_turn_ignored_and_recast_resumes() -> None:
    d = Driver(resolved(None, "hello"))
    work = d.pending()
    tr = d.send(AbortRequested)
    assert any(isinstance(e, CancelWork) and e.visit_id == work.visit_id for e in tr.effects)
    s = d.state
    assert not s.active and s.failed_reason == "aborted by user" and s.phase == "failed" and s.aborted
    assert d.events("cast_end")[-1].data["aborted"] is True
    d.send(TurnEnded, visit_id=work.visit_id, text="late")
    assert d.events("outcome_ignored")[-1].data["reason"] == "cast-inactive"
    with pytest.raises(CastRejected):
        d.send(AbortRequested)
    d.send(RecastRequested)
    s = d.state
    assert s.active and s.last_message == "Recasting from socket Socket-1."
    recast = d.events("cast_recast")[-1].data
    assert recast["reusedActivePrompt"] is True and recast["previousFailure"] == "aborted by user"
    assert d.pending().prompt == work.prompt and s.visits == {"Socket-1": 1}
    d.reply("hi")
    assert d.state.phase == "complete"


def test_71_recast_rejections() -> None:
    d = Driver(resolved(None, "hello"))
    with pytest.raises(CastRejected) as err:
        d.send(RecastRequested)
    assert "already running" in err.value.message
    d.reply("done")
    with pytest.raises(CastRejected) as err:
        d.send(RecastRequested)
    assert "is complete and cannot be recast" in err.value.message
    with pytest.raises(NotRevivable):
        d.send(ReviveRequested)


def test_recast_of_failed_utility_reruns_with_new_visit() -> None:
    cfg = config({"Socket-1": {"type": "utility", "command": ["x"]}})
    d = Driver(resolved(cfg))
    d.utility("", exit_code=1)
    d.send(RecastRequested)
    assert d.events("cast_recast")[-1].data["reusedActivePrompt"] is False
    assert d.state.visits == {"Socket-1": 2} and isinstance(d.pending(), RunUtility)


def test_recast_after_restart_resumes_active_cast() -> None:
    d = Driver(resolved(None, "hello"))
    first = d.pending()
    d.send(RecastRequested, after_restart=True)
    again = d.pending()
    assert again.visit_id != first.visit_id and again.prompt == first.prompt
    d.send(TurnEnded, visit_id=first.visit_id, text="old")
    assert d.events("outcome_ignored")
    d.reply("new")
    assert d.state.phase == "complete" and d.state.last_output == "new"


def test_dispatch_failure_at_entry_fails_cleanly() -> None:
    """Deliberate difference §12 item 16: the cast never stays active after a start error."""
    d = Driver(resolved(None, "hello"))
    d.send(DispatchFailed, visit_id=d.pending().visit_id, error="host has no set-model API")
    assert not d.state.active and "host has no set-model API" in d.state.failed_reason


def test_invalid_json_and_missing_satisfied_fail_with_handoff_messages() -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "J", "parse": "json",
                               "edges": [{"when": "satisfied", "to": "end"}, {"when": "not_satisfied", "to": "end"}]}})
    d = Driver(resolved(cfg))
    d.reply({"passed": True})
    assert 'must include reserved boolean field "satisfied"' in d.state.failed_reason
    d2 = Driver(resolved(cfg))
    d2.reply("nothing")
    assert d2.state.failed_reason.startswith('Invalid JSON output for socket "Socket-1": No JSON found')


def test_max_output_bytes_is_enforced() -> None:
    cfg = config({"Socket-1": {"type": "agent", "materia": "A", "limits": {"maxOutputBytes": 4}}})
    d = Driver(resolved(cfg))
    d.reply("too long")
    assert "maxOutputBytes" in d.state.failed_reason


def test_a_command_over_max_output_bytes_fails_the_cast_not_cut_to_it() -> None:
    """The command's output is capped at the limit, so its kept stdout was never over it: the cast
    completed on the first N bytes (a JSON reply cut mid-way taken as text). Over the limit fails."""
    cfg = config({"Socket-1": {"type": "utility", "command": ["sh", "-c", "echo 0123456789abc"],
                               "limits": {"maxOutputBytes": 10}}})
    d = Driver(resolved(cfg))
    assert d.pending().max_output_bytes == 10
    d.utility("0123456789", exit_code=0, stdout_truncated=True)
    assert d.state.phase == "failed"
    assert 'Output of socket "Socket-1" is over its limits.maxOutputBytes (10)' in d.state.failed_reason
    d2 = Driver(resolved(cfg))
    d2.utility("0123456789", exit_code=0)  # exactly the limit: within it
    assert d2.state.phase == "complete", d2.state.failed_reason


# ----------------------------------------------------------------------------- serialisation


def test_messages_roundtrip_through_adapters() -> None:
    d = build_driver()
    for effect in d.effects:
        assert EFFECT_ADAPTER.validate_python(effect.model_dump(mode="json")) == effect
    ev = TurnEnded(visit_id="v", text="t", usage={"a": 1}, at=1.5)
    assert EVENT_ADAPTER.validate_python(ev.model_dump(mode="json")) == ev


def test_state_rejects_unknown_version() -> None:
    d = Driver(resolved(None, "hello"))
    raw = json.loads(d.state.to_json())
    raw["version"] = 99
    from castor.messages.errors import InvalidMessage

    with pytest.raises(InvalidMessage):
        CastState.from_json(json.dumps(raw))
    with pytest.raises(InvalidMessage):
        CastState.from_json("{not json")


json_leaf = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=10) | st.floats(
    allow_nan=False, allow_infinity=False, width=32)
json_data = st.recursive(json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c,
                                                                                          max_size=3), max_leaves=10)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["ok", "reject", "ctx", "ws"]), min_size=1, max_size=14),
       st.dictionaries(st.text(max_size=6), json_data, max_size=3))
def test_cast_state_json_roundtrip_through_random_walks(moves: list[str], seed: dict[str, Any]) -> None:
    """Every state the engine produces survives to_json/from_json exactly and steps identically."""
    d = Driver(resolved(None, "build"), data=seed)
    d.utility({"ok": True})
    d.utility({"kind": "none"})
    d.reply(ITEMS)
    for move in moves:
        state = d.state
        restored = CastState.from_json(state.to_json())
        assert restored == state
        if not state.active or state.pending is None:
            break
        work = d.pending()
        if isinstance(work, Compact):
            tr = step(restored, CompactionFinished(visit_id=work.visit_id, ok=True, at=d.t + 1))
            d.compacted()
            assert tr.state == d.state  # the restored state steps exactly like the live one
            continue
        if isinstance(work, RunUtility):
            d.utility("")
            continue
        text = {"satisfied": move != "reject"} if work.socket_id == "Socket-5" else "work"
        if move == "ctx":
            d.fail_turn("context window exceeded")
        elif move == "ws":
            d.fail_turn("WebSocket error")
        else:
            d.reply(text)
    final = d.state
    assert CastState.from_json(final.to_json()) == final


def _yolo(maintain_edges: list[dict[str, Any]]) -> Any:
    sockets = {
        "Socket-1": {"type": "agent", "materia": "G", "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "utility", "command": ["build"], "edges": [{"when": "always", "to": "Socket-3"}]},
        "Socket-3": {"type": "agent", "materia": "J", "parse": "json", "edges": maintain_edges},
    }
    loops = {"lp": {"sockets": ["Socket-2", "Socket-3"], "consumes": {"from": "Socket-1"},
                    "exit": {"from": "Socket-3", "when": "satisfied", "to": "end"}}}
    return resolved(config(sockets, loops=loops))


def test_39_40_yolo_loop_counts() -> None:
    edges = [{"when": "satisfied", "to": "Socket-2"}, {"when": "not_satisfied", "to": "Socket-2"}]
    one = Driver(_yolo(edges))
    one.reply({"workItems": [{"id": "alpha"}]})
    one.utility("built")
    one.reply({"satisfied": True})
    assert one.state.phase == "complete" and one.state.visits == {"Socket-1": 1, "Socket-2": 1, "Socket-3": 1}
    assert "Socket-3->Socket-2" not in one.state.edge_traversals

    two = Driver(_yolo(edges))
    two.reply({"workItems": [{"id": "alpha"}, {"id": "beta"}]})
    for maintain in (False, True, True):
        two.utility("built")
        two.reply({"satisfied": maintain})
    s = two.state
    assert s.phase == "complete" and (s.visits["Socket-2"], s.visits["Socket-3"]) == (3, 3)
    assert s.edge_traversals["Socket-3->Socket-2"] == 2 and s.cursors["workItemIndex"] == 2
    retry_input = json.loads(two.artifacts()["sockets/Socket-2/2-alpha.input.json"].content)
    assert retry_input["cursor"] == {"name": "workItemIndex", "index": 0} and retry_input["itemKey"] == "alpha"


def test_lone_surrogates_from_outside_never_reach_the_state() -> None:
    """A JSON escape of a lone surrogate (a model's answer, a utility's output) or an undecodable
    argv byte in the request would make the state unwritable as UTF-8: each becomes U+FFFD."""
    cfg = config({"Socket-1": {"type": "agent", "materia": "J", "parse": "json", "assign": {"seen": "$.a"},
                               "edges": [{"when": "always", "to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "A"}})
    d = Driver(resolved(cfg), request="bad \udcff request")
    assert d.state.request == "bad \ufffd request"
    d.reply('{"a": "x\\ud800y"}')
    assert d.state.data["seen"] == "x\ufffdy"
    d.reply("raw \ud800 text")
    assert d.state.phase == "complete" and d.state.last_output == "raw \ufffd text"
    d.state.model_dump_json().encode("utf-8")  # the whole state serialises
    for effect in d.effects:
        effect.model_dump_json().encode("utf-8")  # and so does every effect (events, artifacts)


def test_recast_after_restart_cancels_the_abandoned_visit_before_redispatching() -> None:
    """The lost visit's work is redone under a new id; the old job (maybe still queued in the
    utility pool) is cancelled first, so it never runs beside the new one."""
    cfg = config({"Socket-1": {"type": "utility", "command": ["true"]}})
    d = Driver(resolved(cfg))
    first = d.pending()
    tr = d.send(RecastRequested, after_restart=True)
    kinds = [type(e).__name__ for e in tr.effects]
    assert kinds.index("CancelWork") < kinds.index("RunUtility")
    cancel = next(e for e in tr.effects if type(e).__name__ == "CancelWork")
    assert cancel.visit_id == first.visit_id and d.pending().visit_id != first.visit_id



def test_a_turn_sent_again_after_a_restart_is_named_in_a_warning_with_the_cause_and_abort() -> None:
    """An Esc pressed while the crashed incarnation's turn was being stopped ends only that run: the
    re-sent turn is what the harness runs next, so the user is told it runs again and how to stop it.
    A restart with no turn in flight (a utility job) names no turn."""
    from castor.domain.materia.cast_messages import Notify

    d = Driver(resolved(None, "hello"))
    cause = "the cast's actor crashed (ActorKilled) and was restarted"
    tr = d.send(RecastRequested, after_restart=True, cause=cause)
    (told,) = [e for e in tr.effects if isinstance(e, Notify) and "runs again" in e.message]
    assert told.level == "warning"
    socket = d.state.current_socket_id
    assert f"({socket}): {cause} while its turn ran" in told.message and "abort" in told.message
    utility = Driver(resolved(config({"Socket-1": {"type": "utility", "command": ["true"]}})))
    tr = utility.send(RecastRequested, after_restart=True, cause=cause)
    assert not [e for e in tr.effects if isinstance(e, Notify) and "its turn ran" in e.message]


# ----------------------------------------------------------------------------- numbers past int()'s digit limit

HUGE = "9" * 5000  # past Python's 4,300-digit limit for int(text); a config file may hold it as text


@pytest.mark.timeout(30)
def test_a_socket_id_with_thousands_of_digits_runs_and_is_shown_by_its_digits() -> None:
    # The visible "Casting **M (N)**" summary read N with int(): a ValueError that crashed the cast's
    # actor, which re-sent the previous turn on every restart.
    big = f"Socket-{HUGE}"
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A", "edges": [{"to": big}]},
                                big: {"type": "agent", "materia": "A"}})))
    d.reply("one")
    assert d.pending().socket_id == big and d.pending().visible_summary == f"Casting **A ({HUGE})**"
    d.reply("two")
    assert d.state.phase == "complete"


@pytest.mark.timeout(30)
def test_an_assign_path_index_with_thousands_of_digits_reads_nothing() -> None:
    # walk() indexed the list with int(segment): the same crash. No list is that long: undefined.
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A", "parse": "json",
                                             "assign": {"x": f"$.items.{HUGE}", "y": "$.items.1"}}})))
    d.reply({"items": [1, 2]})
    assert d.state.phase == "complete" and "x" not in d.state.data and d.state.data["y"] == 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("literal", "value", "moves"), [
    (HUGE, 1, False),  # Number() reads it as Infinity: equal to nothing a model writes (int() crashed)
    (f"-{HUGE}", 1, False),
    ("123456789012345678901", 123456789012345678901, True),  # past 2**53 both are the same double
    ("1e999", None, False),  # no exponent in a literal: a path into state.data, undefined, not null
    ("2", 2, True),
    ("2.0", 2, True),
    ("01", 1, True),
])
def test_a_condition_literal_is_read_as_javascripts_number_reads_it(literal: str, value: Any, moves: bool) -> None:
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A", "parse": "json",
                                             "advance": {"cursor": "c", "items": "$.items",
                                                         "when": f"$.n == {literal}"}}})))
    d.reply(json.dumps({"items": [1, 2, 3], "n": value}) if value is not None else '{"items": [1, 2, 3], "n": null}')
    assert d.state.phase == "complete"
    assert d.state.cursors.get("c", 0) == (1 if moves else 0)


# ----------------------------------------------------------------------------- prompt templates


@pytest.mark.timeout(30)
def test_template_keys_render_as_pi_materias_do() -> None:
    # {{itemJson}} with no item is JSON.stringify(undefined): nothing (it rendered "null"); {{cursor.X}}
    # reads the cursor named X, dots and all (it walked a path: a cursor "w.i" rendered nothing);
    # "{{}}" names no key and stays as written (it rendered the whole of state.data).
    prompt = "I=[{{itemJson}}] E=[{{}}] C=[{{cursor.w.i}}] J=[{{lastJson}}] T=[{{ item.title }}]"
    cfg = resolved(config(
        {"Socket-1": {"type": "agent", "materia": "P", "parse": "json", "edges": [{"to": "Socket-2"}]},
         "Socket-2": {"type": "agent", "materia": "P", "parse": "json",
                      "foreach": {"items": "state.list", "cursor": "w.i"},
                      "advance": {"cursor": "w.i", "items": "state.list"}}},
        materia={"P": {"prompt": prompt, "tools": "none"}}))
    d = Driver(cfg, data={"list": [{"title": "T"}]})
    assert "I=[] E=[{{}}] C=[] J=[] T=[]" in d.pending().prompt
    d.reply({"x": 1})
    assert 'I=[{\n  "title": "T"\n}] E=[{{}}] C=[0] J=[{\n  "x": 1\n}] T=[T]' in d.pending().prompt


@pytest.mark.timeout(30)
def test_advance_items_read_dollar_as_the_last_json_reply_as_pi_materia_does() -> None:
    # pi-materia resolves advance.items with no reply of its own, so "$" is lastJson: a text socket
    # stepping through "$.workItems" walks the list the last JSON reply gave (castor read "$" as the
    # text socket's own reply, found no list and ended the loop after its first item).
    cfg = resolved(config(
        {"Socket-1": {"type": "agent", "materia": "A", "parse": "json", "edges": [{"to": "Socket-2"}]},
         "Socket-2": {"type": "agent", "materia": "A", "advance": {"cursor": "c", "items": "$.workItems"},
                      "edges": [{"to": "Socket-2"}]}}))
    d = Driver(cfg)
    d.reply({"workItems": [{"id": "a"}, {"id": "b"}]})
    d.reply("built a")
    assert d.state.active and d.pending().socket_id == "Socket-2" and d.state.cursors["c"] == 1
    d.reply("built b")
    assert d.state.phase == "complete" and d.state.cursors["c"] == 2 and d.state.visits["Socket-2"] == 2


@pytest.mark.timeout(30)
def test_a_dotted_loop_alias_is_a_path_in_state_data_as_in_pi_materia() -> None:
    # pi-materia writes the current item under foreach.as with setPath: "ctx.task" is data.ctx.task
    # (castor wrote a key named "ctx.task", which no template or expression could reach).
    cfg = resolved(config(
        {"Socket-1": {"type": "agent", "materia": "P", "foreach": {"items": "state.list", "as": "ctx.task"},
                      "edges": [{"to": "Socket-2"}]},
         "Socket-2": {"type": "agent", "materia": "P"}},
        materia={"P": {"prompt": "T=[{{ctx.task.title}}]", "tools": "none"}}))
    d = Driver(cfg, data={"list": [{"title": "Alpha"}], "ctx": {"keep": 1}})
    assert "T=[Alpha]" in d.pending().prompt and d.state.data["ctx"] == {"keep": 1, "task": {"title": "Alpha"}}
    assert "ctx.task" not in d.state.data
    d.reply("done")
    # after the loop the finished item leaves that name too (castor's deliberate difference), the rest stays
    assert "T=[]" in d.pending().prompt and d.state.data["ctx"] == {"keep": 1}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body", ["{{" + " " * 100_000 + "x", "{" * 100_000, "{{a} " * 20_000])
def test_a_prompt_with_an_unclosed_placeholder_renders_in_linear_time(body: str) -> None:
    # The placeholder pattern {{\s*([^}]+?)\s*}} backtracks cubically over whitespace after an
    # unclosed "{{": 5,000 spaces took a minute, holding the cast's actor at every socket start.
    cfg = resolved(config({"Socket-1": {"type": "agent", "materia": "P"}},
                          materia={"P": {"prompt": body, "tools": "none"}}))
    started = time.monotonic()
    d = Driver(cfg)
    assert time.monotonic() - started < 5.0
    assert body in d.pending().prompt  # nothing in it is a placeholder: kept as written


@pytest.mark.timeout(30)
def test_placeholders_are_found_as_pi_materias_pattern_finds_them() -> None:
    prompt = "A=[{{ request }}] B=[{{}}] C=[{{a} b}}] D=[{{request}}}] E=[{{{request}}]"
    cfg = resolved(config({"Socket-1": {"type": "agent", "materia": "P"}},
                          materia={"P": {"prompt": prompt + " F=[{{ }}]", "tools": "none"}}))
    d = Driver(cfg, request="R", data={"k": 1})
    # "{{ }}" names the empty path: state.data as JSON; "{{}}" names nothing; "{{{x}}" reads "{x"
    assert 'A=[R] B=[{{}}] C=[{{a} b}}] D=[R}] E=[] F=[{\n  "k": 1\n}]' in d.pending().prompt


@pytest.mark.timeout(10)
def test_a_budget_stop_says_which_limit_and_the_figure_that_reached_it() -> None:
    """The cast failed "pi-materia budget limit reached" (pi-materia's reason) with no word of which
    limit or how far past it: a user could not tell a token budget from a cost budget."""
    from castor.domain.materia.cast_messages import Notify

    cfg = config({"Socket-1": {"type": "agent", "materia": "A", "edges": [{"to": "Socket-2"}]},
                  "Socket-2": {"type": "agent", "materia": "A"}},
                 budget={"maxTokens": 100, "maxCostUsd": 0.5, "warnAtPercent": 1000})
    d = Driver(resolved(cfg))
    d.reply("one", usage={"total": 160, "cost": {"total": 0.75, "totalFromProvider": True}})
    texts = [e.message for e in d.effects if isinstance(e, Notify) and "budget" in e.message]
    assert texts == ["pi-materia budget limit reached: 160 tokens of budget.maxTokens 100 and $0.7500 of "
                     "budget.maxCostUsd 0.5",
                     "pi-materia cast failed: pi-materia budget limit reached (cast cast-1)"], texts
    assert d.state.failed_reason == "pi-materia budget limit reached"


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("usage", "said"), [
    ({"input": 10, "output": 5, "cost": {"total": 0.01, "totalFromProvider": True}}, "15 tokens, $0.0100."),
    ({"input": 10, "output": 5, "cost": {"total": 0.01, "totalFromProvider": False}},
     "15 tokens, $0.0100 (estimated)."),
    ({"input": 10, "output": 5}, "15 tokens, $0.0000 (estimated; 1 turn with no price counted as $0)."),
    ({"input": 0, "output": 0}, "0 tokens, $0.0000 (estimated; 1 turn reported no usage)."),
    ({"input": 10, "output": "5"},
     "10 tokens, $0.0000 (estimated; 1 turn with unreadable figures left out)."),
])
def test_the_end_notice_says_what_its_totals_leave_out(usage, said) -> None:
    """"15 tokens, $0.0000." read as a billed nothing when the model had no price, the provider sent
    no usage, or a figure was no number: the notice now says so."""
    from castor.domain.materia.cast_messages import Notify

    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A"}})))
    d.reply("one", usage=usage)
    (done,) = [e.message for e in d.effects if isinstance(e, Notify) and "cast complete" in e.message]
    assert done.endswith(f": {said}"), done
