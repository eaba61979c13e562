"""Numbered pi-icarus-hook behaviours whose only proof was the pure lifecycle / tools functions, driven here the
way a harness meets them: ``harness.event``, ``icarus.tool`` and ``icarus.config`` over a real
msgpack-rpc endpoint, hooks and tools running in real worker subprocesses of the REFERENCE
BACKEND (a stand-in for the private Icarus plugin, whose own call log is the evidence of what
ran). Faked only the harness side (``FakeHarness``). Tests are named ``test_<N>_…`` after the
item; the map in docs/icarus.md lists them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from castor.client import Client
from castor.messages.errors import CastorError
from tests.actors.icarus.test_session_endpoint import FakeHarness, open_session
from tests.actors.icarus.test_session_endpoint import wired as wired  # noqa: F401 - the endpoint fixture, shared
from tests.support.icarus import REFERENCE_ICARUS, gone, wait_until

SID = "pi-1"


class Pi:
    """The harness's side of one session: events and commands as the Pi extension sends them."""

    def __init__(self, client: Client, harness: FakeHarness) -> None:
        self.client = client
        self.harness = harness

    def event(self, event: str, **data: Any) -> Any:
        return self.client.call("harness.event", {"session_id": SID, "event": event, "data": data})

    def prompt(self, text: str, message_type: str = "user") -> Any:
        return self.event("before_agent_start", prompt=text, message_type=message_type)

    def agent_end(self, *messages: tuple[str, str, str | None]) -> Any:
        return self.event("agent_end", messages=[{"role": role, "text": text, "stop_reason": stop}
                                                 for role, text, stop in messages])

    def command(self, args: str) -> dict[str, Any]:
        return self.client.call("icarus.command", {"session_id": SID, "args": args})

    def tool(self, name: str, params: dict[str, Any], **extra: Any) -> Any:
        return self.client.call("icarus.tool", {"session_id": SID, "name": name, "params": params,
                                                "tool_call_id": "t1", **extra})


@pytest.fixture
def pi(wired):  # noqa: F811 - the shared fixture above
    world, connect = wired
    client, harness = connect()
    open_session(client, world, SID)
    return world, Pi(client, harness)


# --------------------------------------------------------------------------- lifecycle


def test_22_blank_startup_context_sends_no_message(pi):
    world, p = pi
    world.env["ICARUS_REF_STARTUP_CONTEXT"] = "  \n "
    assert p.event("session_start", reason="startup") == {}
    assert len(world.calls("hooks.on_session_start")) == 1
    p.prompt("anything")  # a later round trip: any message.send of the start would be before it
    assert [m for m, _ in p.harness.notes if m == "message.send"] == []


def test_24_27_disabled_blank_and_custom_prompts_do_not_consume_the_first_turn(pi):
    world, p = pi
    p.event("session_start", reason="startup")
    assert "hooks are off" in p.command("off")["text"]
    assert p.prompt("while off") == {}
    assert "hooks are on" in p.command("on")["text"]
    assert p.prompt("") == {} and p.prompt("   \n") == {}
    assert p.prompt("castor's hidden prompt", message_type="custom") == {}
    assert world.calls("hooks.pre_llm_call") == []
    p.prompt("first real prompt")
    p.prompt("second real prompt")
    calls = world.calls("hooks.pre_llm_call")
    assert [c["kwargs"] for c in calls] == [
        {"session_id": SID, "user_message": "first real prompt", "is_first_turn": True},
        {"session_id": SID, "user_message": "second real prompt", "is_first_turn": False}]


def test_30_33_retries_then_settlement_capture_once_with_the_final_text_and_grouped_users(pi):
    world, p = pi
    p.event("session_start", reason="startup")
    p.prompt("first ask")
    assert p.agent_end(("user", "first ask", None), ("assistant", "draft", "error")) == {}
    assert p.agent_end(("user", "queued follow-up", None), ("assistant", "FINAL ANSWER", "stop")) == {}
    assert world.calls("hooks.post_llm_call") == []  # agent_end never captures by itself
    assert p.event("agent_settled", aborted=False) == {}
    [capture] = world.calls("hooks.post_llm_call")
    assert capture["kwargs"] == {"session_id": SID, "user_message": "first ask\n\nqueued follow-up",
                                 "assistant_response": "FINAL ANSWER", "platform": "pi"}
    assert p.event("agent_settled", aborted=False) == {}  # a second settlement has nothing left to capture
    assert len(world.calls("hooks.post_llm_call")) == 1


@pytest.mark.timeout(60)
def test_a_cast_turn_pi_ran_inside_the_users_run_is_not_captured_as_the_users_answer(pi):
    """A cast's turn castor asked for while the user's run went on: Pi runs it as a follow-up of
    that run, and the run's one agent_end (the extension's message summaries, the cast's turn id)
    holds the user's exchange, the hidden prompt and the cast's answer."""
    world, p = pi
    p.prompt("what is the WAL mode")
    p.event("agent_end", turn_id="visit-1", messages=[
        {"role": "user", "text": "what is the WAL mode"},
        {"role": "assistant", "text": "USER ANSWER", "stop_reason": "stop"},
        {"role": "custom", "text": "HIDDEN MATERIA PROMPT", "custom_type": "pi-materia-prompt"},
        {"role": "assistant", "text": "HIDDEN CAST ANSWER", "stop_reason": "stop"}])
    assert p.event("agent_settled", aborted=False, turn_id="visit-1") == {}
    [capture] = world.calls("hooks.post_llm_call")
    assert capture["kwargs"]["user_message"] == "what is the WAL mode"
    assert capture["kwargs"]["assistant_response"] == "USER ANSWER"


def test_33_with_no_user_message_observed_the_prompt_is_the_user_message(pi):
    world, p = pi
    p.prompt("the original prompt")
    p.agent_end(("assistant", "answer", "stop"))
    p.event("agent_settled", aborted=False)
    [capture] = world.calls("hooks.post_llm_call")
    assert capture["kwargs"]["user_message"] == "the original prompt"


def test_31_agent_end_without_settlement_never_captures(pi):
    world, p = pi
    p.prompt("ask")
    p.agent_end(("user", "ask", None), ("assistant", "answer", "stop"))
    p.prompt("next ask")  # a round trip after the end: a capture would have run by now
    assert world.calls("hooks.post_llm_call") == []


@pytest.mark.parametrize("stop, text, aborted", [
    ("aborted", "answer", False), ("error", "answer", False), ("length", "answer", False),
    ("toolUse", "answer", False), ("stop", "  ", False), ("stop", "answer", True)])
def test_32_no_capture_unless_the_final_answer_stopped_normally_with_text(pi, stop, text, aborted):
    world, p = pi
    p.prompt("ask")
    p.agent_end(("user", "ask", None), ("assistant", text, stop))
    assert p.event("agent_settled", aborted=aborted) == {}
    p.prompt("next ask")
    assert world.calls("hooks.post_llm_call") == []


def test_34_disable_and_reenable_before_settlement_drops_the_buffered_capture(pi):
    world, p = pi
    p.prompt("ask")
    p.agent_end(("user", "ask", None), ("assistant", "answer", "stop"))
    p.command("off")
    p.command("on")
    assert p.event("agent_settled", aborted=False) == {}
    p.prompt("next ask")
    assert world.calls("hooks.post_llm_call") == []


def test_39_a_repeated_session_start_runs_on_session_start_once(pi):
    world, p = pi
    for _ in range(3):
        assert p.event("session_start", reason="startup") == {}
    assert [c["kwargs"] for c in world.calls("hooks.on_session_start")] == [{"session_id": SID, "platform": "pi"}]


# --------------------------------------------------------------------------- tools


def _written(world) -> list[dict[str, Any]]:
    return [c["args"][0] for c in world.calls("tools.fabric_write")]


@pytest.mark.parametrize("given, forwarded", [(True, "true"), ("True", "true"), (False, "false"),
                                              ("false", "false"), (1, "true"), (" yes ", "true")])
def test_71_verified_reaches_the_backend_as_the_strings_true_or_false(pi, given, forwarded):
    world, p = pi
    params = {"type": "note", "summary": "s", "content": "c", "verified": given, "evidence": "ran the tests"}
    assert p.tool("fabric_write", params)["status"] == "written"
    assert _written(world) == [{**params, "verified": forwarded}]


def test_72_verified_left_out_stays_out(pi):
    world, p = pi
    params = {"type": "note", "summary": "s", "content": "c", "tags": "t", "customer_id": "c9"}
    p.tool("fabric_write", params)
    assert _written(world) == [params]  # unchanged: no key added, none renamed


@pytest.mark.parametrize("params, message", [
    ({"verified": True}, "requires evidence"), ({"verified": "yes", "evidence": "  "}, "requires evidence"),
    ({"verified": "maybe"}, "verified must be"), ({"verified": [1]}, "verified must be")])
def test_73_74_invalid_verified_never_reaches_the_backend_and_is_a_tool_error(pi, params, message):
    world, p = pi
    result = p.tool("fabric_write", {"type": "note", "summary": "s", "content": "c", **params}, format="result")
    assert result["is_error"] is True and message in result["details"]["error"]
    assert message in result["content"][0]["text"]
    assert world.calls("tools.fabric_write") == [] and world.calls() == []  # no worker call at all


def test_75_76_backend_error_values_are_marked_and_success_values_are_passed_through(pi):
    world, p = pi
    failed = p.tool("fabric_search", {"query": ""}, format="result")
    assert failed["is_error"] is True and failed["details"]["error"]
    assert failed["details"]["error"] in failed["content"][0]["text"]
    found = p.tool("fabric_search", {"query": "nothing-matches-this"})
    assert found["count"] == 0 and found["results"] == [] and "error" not in found
    as_result = p.tool("fabric_search", {"query": "nothing-matches-this"}, format="result")
    assert as_result["details"] == found and not as_result["is_error"]
    assert json.loads(as_result["content"][0]["text"]) == found


def _tool_names(p: Pi) -> set[str]:
    return {t["name"] for t in p.client.call("icarus.config", {"session_id": SID})["tools"]}


@pytest.mark.parametrize("settings, has_tools, has_admin", [
    ({}, True, False), ({"adminTools": True}, True, True), ({"adminTools": True, "tools": False}, False, False)])
def test_77_admin_tools_only_with_tools_and_never_by_default(wired, settings, has_tools, has_admin):  # noqa: F811
    world, connect = wired
    world.write_global(**settings)
    client, harness = connect()
    open_session(client, world, SID)
    names = _tool_names(Pi(client, harness))
    assert ("fabric_write" in names) is has_tools and ("icarus_hook_config" in names) is has_tools
    assert ("fabric_train" in names) is has_admin


def test_78_fabric_search_offers_no_limit(pi):
    _world, p = pi
    tools = {t["name"]: t for t in p.client.call("icarus.config", {"session_id": SID})["tools"]}
    schema = tools["fabric_search"]["parameters"]
    assert schema["required"] == ["query"] and "limit" not in schema["properties"]


# --------------------------------------------------------------------------- classifier and audit


class ModelsHarness(FakeHarness):
    """The fake harness with a chosen model registry; records which models were asked."""

    def __init__(self, client: Client, models: list[dict[str, Any]]) -> None:
        super().__init__(client)
        self.asked: list[tuple[str, str]] = []
        client.on_request("model.list", lambda _p: {"models": models, "current": None})

    def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        self.asked.append((params["provider"], params["model"]))
        return super().complete(params)


LOCAL = {"provider": "ollama", "id": "qwen3:4b", "base_url": "http://127.0.0.1:11434/v1", "available": True}
REMOTE = {"provider": "openai", "id": "gpt-remote", "base_url": "https://api.openai.com/v1", "available": True}
NAMED_LOCAL = {"provider": "local", "id": "remote-in-disguise", "base_url": "https://models.example.com/v1",
               "available": True}


def _session_with(wired, models: list[dict[str, Any]], **settings: Any) -> tuple[Any, Pi]:  # noqa: F811
    world, connect = wired
    world.write_global(**settings)
    client, _ = connect()
    harness = ModelsHarness(client, models)
    open_session(client, world, SID)
    return world, Pi(client, harness)


def test_53_51_every_candidate_rejected_injects_nothing_yet_the_audit_is_written_with_unknown_usage(wired):  # noqa: F811
    world, connect = wired
    world.seed(("chocolate cake recipe", "eggs"), ("cake decorating notes", "icing"))
    client, harness = connect()
    open_session(client, world, SID)
    p = Pi(client, harness)
    assert p.prompt("cake") == {}  # retrieved, all rejected, nothing protected: nothing injected
    assert len(world.calls("hooks.pre_llm_call", phase="end")) == 1
    [entry] = harness.entries
    audit = entry["data"]
    assert entry["custom_type"] == "icarus-context-filter" and audit["outcome"] == "filtered"
    assert audit["injectedIds"] == [] and audit["counts"]["rejected"] == 2 and audit["chars"]["injected"] == 0
    assert audit["usage"] is None  # the classifier reported none: unknown, not zeros
    assert "cake" not in json.dumps(entry)


def test_47_an_exact_classifier_missing_from_the_registry_is_never_substituted(wired):  # noqa: F811
    world, p = _session_with(wired, [LOCAL, REMOTE], classifier="anthropic/not-registered")
    world.seed(("chocolate cake recipe", "eggs"))
    result = p.prompt("cake")
    assert "chocolate cake recipe" in result["message"]["content"]  # the original, unfiltered
    assert p.harness.asked == []  # no model was called, not even the local one
    [entry] = p.harness.entries
    assert (entry["data"]["outcome"], entry["data"]["reason"]) == ("fallback", "model_unavailable")


def test_48_default_picks_the_loopback_model_and_a_provider_named_local_is_not_local(wired):  # noqa: F811
    world, p = _session_with(wired, [NAMED_LOCAL, REMOTE, LOCAL], classifier="default")
    world.seed(("sqlite WAL notes", "WAL"), ("chocolate cake recipe", "eggs"))
    content = p.prompt("sqlite cake")["message"]["content"]
    assert "sqlite WAL notes" in content and "cake" not in content
    assert p.harness.asked == [("ollama", "qwen3:4b")]
    [entry] = p.harness.entries
    assert entry["data"]["classifier"]["local"] is True


# --------------------------------------------------------------------------- more lifecycle, filtering, settings


def _open(wired, *, trusted: bool = False, sid: str = SID) -> tuple[Any, Pi]:  # noqa: F811
    world, connect = wired
    client, harness = connect()
    client.call("session.open", {"session_id": sid, "cwd": str(world.project), "trusted": trusted,
                                 "flags": {"harness": "pi", "has_agent_settled": True}})
    return world, Pi(client, harness)


def test_26_the_injected_message_carries_the_sessions_visibility(pi):
    world, p = pi
    world.seed(("zebra notes", "stripes"), ("giraffe notes", "necks"))
    shown = p.prompt("zebra")["message"]
    assert (shown["custom_type"], shown["display"]) == ("icarus-memory-context", True)
    assert "hidden" in p.command("context hide")["text"]
    hidden = p.prompt("giraffe")["message"]
    assert hidden["display"] is False and "giraffe notes" in hidden["content"]  # hidden, still sent


def test_35_36_every_hook_failing_is_ambient_and_shutdown_still_ends_and_closes(pi):
    world, p = pi
    world.controls({f"hooks.{name}": {"raise": "backend exploded"}
                    for name in ("on_session_start", "pre_llm_call", "post_llm_call", "on_session_end")})
    assert p.event("session_start", reason="startup") == {}
    assert p.prompt("q") == {}
    p.agent_end(("user", "q", None), ("assistant", "a", "stop"))
    assert p.event("agent_settled", aborted=False) == {}
    pid = p.client.call("ops.worker", {"session_id": SID})["worker"]["process"]["pid"]
    assert p.event("session_shutdown", reason="quit") == {}
    [ended] = world.calls("hooks.on_session_end")
    assert ended["kwargs"] == {"session_id": SID, "platform": "pi"}  # no `completed`
    assert [c["call"] for c in world.calls()] == ["hooks.on_session_start", "hooks.pre_llm_call",
                                                   "hooks.post_llm_call", "hooks.on_session_end"]
    wait_until(lambda: gone(pid), 5, "the worker closed at shutdown")

    def footer_cleared_last() -> bool:  # notifications reach the fake on the client's worker thread
        statuses = [n for m, n in p.harness.notes if m == "ui.status"]
        return bool(statuses) and statuses[-1].get("text") is None

    wait_until(footer_cleared_last, 5, "the footer cleared last")


def test_42_43_protected_sections_stay_verbatim_and_a_rejection_removes_exactly_its_slice(wired):  # noqa: F811
    world, connect = wired
    world.env["ICARUS_REF_WARNING"] = "memory store is degraded, tell the user about cake"
    world.seed(("sqlite WAL notes", "WAL"), ("chocolate cake recipe", "eggs"), facts=("user likes cake",))
    sent: list[list[dict[str, Any]]] = []
    client, harness = connect()
    inner = harness.complete
    client.on_request("classifier.complete", lambda params: (
        sent.append(json.loads(params["messages"][-1]["content"])["candidates"]), inner(params))[1])
    open_session(client, world, SID)
    filtered = Pi(client, harness).prompt("sqlite cake")["message"]["content"]

    world.write_global(classifier="none")  # the same retrieval, unfiltered, in a fresh worker
    _w, plain_pi = _open(wired, sid="pi-plain")
    original = plain_pi.client.call("harness.event", {"session_id": "pi-plain", "event": "before_agent_start",
                                                      "data": {"prompt": "sqlite cake", "message_type": "user"}})
    original_text = original["message"]["content"]
    [cake_line] = [line for line in original_text.split("\n") if "chocolate cake recipe" in line]
    assert filtered == original_text.replace(cake_line + "\n", "", 1) or \
        filtered == original_text.replace("\n" + cake_line, "", 1)
    assert "[memory-retrieval-warning]" in filtered and "user likes cake" in filtered
    [candidates] = sent
    assert [c["section"] for c in candidates] == ["fabric", "fabric"]  # facts and the warning never sent
    assert not any("likes cake" in c["text"] or "degraded" in c["text"] for c in candidates)


def test_57_60_project_settings_env_switches_are_ignored_and_a_corrupt_file_is_no_error(wired):  # noqa: F811
    world, _connect = wired
    world.env["PI_ICARUS_HOOK_TOOLS"] = "1"
    world.write_project({"tools": False})
    _w, p = _open(wired, trusted=True)
    assert _tool_names(p) == set()  # the trusted project's tools:false wins over PI_ICARUS_HOOK_TOOLS

    world.project_path.write_text("{ not json")
    _w, p2 = _open(wired, trusted=True, sid="pi-2")
    names = {t["name"] for t in p2.client.call("icarus.config", {"session_id": "pi-2"})["tools"]}
    assert "fabric_write" in names  # global settings and defaults, no error


def test_62_inspection_reads_the_legacy_alias_of_the_trusted_project(wired):  # noqa: F811
    world, _connect = wired
    world.write_global(contextDisplay=True)
    world.write_project({"hiddenDisplay": False})
    _w, p = _open(wired, trusted=True)
    reply = p.command("context default status")["text"]
    assert "Startup default is hidden from project settings" in reply, reply
    assert str(world.project_path) in reply


def test_68_a_write_lands_in_the_existing_alias_section(wired):  # noqa: F811
    world, _connect = wired
    world.write_global({"icarusHook": world.section(), "unrelated": "preserved"})
    _w, p = _open(wired)
    reply = p.command("context default hide")
    assert "global settings" in reply["text"], reply
    doc = json.loads(world.global_path.read_text())
    assert "piIcarusHook" not in doc and doc["icarusHook"]["contextDisplay"] is False
    assert doc["unrelated"] == "preserved" and doc["icarusHook"]["icarusDir"] == str(REFERENCE_ICARUS)


# ------------------------------------------------------------ /icarus command texts (the pinned substrings)


def test_65_70_context_default_writes_say_what_they_wrote_and_the_session_is_unchanged(wired):  # noqa: F811
    world, _connect = wired
    world.write_project({"contextDisplay": True})
    _w, p = _open(wired, trusted=True)
    reply = p.command("context default TOGGLE Global")  # words are case-insensitive
    text = reply["text"]
    assert "global settings" in text and str(world.global_path) in text, text
    assert "future Pi sessions" in text and "Current session is still visible" in text, text
    assert "project" in text.split("global settings", 1)[1], text  # the trusted project's value overrides it
    assert json.loads(world.global_path.read_text())["piIcarusHook"]["contextDisplay"] is False
    status = p.command("context status")["text"]
    assert "visible" in status and "hidden" not in status, status


def test_40_with_hooks_false_the_command_says_hooks_are_not_registered_and_config_still_works(wired):  # noqa: F811
    world, _connect = wired
    world.write_global(hooks=False)
    _w, p = _open(wired)
    for args in ("", "on", "status", "context hide"):
        reply = p.command(args)
        assert "not registered" in reply["text"] and "settings" in reply["text"], (args, reply)
    assert p.command("context hide")["level"] == "warning"
    assert json.loads(p.command("config")["text"])["effective"]["hooks"] is False
    assert json.loads(p.command("schema")["text"])["key"] == "piIcarusHook"
    assert p.prompt("q") == {} and world.calls() == []


@pytest.mark.parametrize("failure", ["raise", "refuse"])
def test_50_an_audit_the_harness_cannot_append_releases_the_original_and_warns(wired, failure):  # noqa: F811
    world, connect = wired
    world.seed(("sqlite WAL notes", "WAL"), ("chocolate cake recipe", "eggs"))
    client, harness = connect()

    def append_entry(_params: dict[str, Any]) -> dict[str, Any]:
        if failure == "raise":
            raise RuntimeError("session file is read-only")
        return {"ok": False}

    client.on_request("session.append_entry", append_entry)
    open_session(client, world, SID)
    content = Pi(client, harness).prompt("sqlite cake")["message"]["content"]
    assert "sqlite WAL notes" in content and "chocolate cake recipe" in content  # nothing discarded untraced
    note = harness.wait_note("ui.notify")
    assert note.get("level") == "warning" and "read-only" not in json.dumps(note), note


# ------------------------------------------------- pi-icarus-hook's own texts and shapes, at the endpoint


def test_context_default_replies_name_the_saved_default_for_future_sessions(wired):  # noqa: F811
    # pi-icarus-hook's own settings test: a legacy-alias global default, toggled, hidden, then shown
    # in the trusted project; each reply says the default it saved "by default for future Pi sessions".
    world, _connect = wired
    world.write_global({"piIcarusHook": world.section(hiddenDisplay=False), "unrelated": "preserved"})
    _w, p = _open(wired, trusted=True)
    assert "Startup default is hidden from global settings" in p.command("context default status")["text"]
    toggled = p.command("context default toggle")["text"]
    assert "visible by default for future Pi sessions" in toggled, toggled
    assert "Current session is still hidden" in toggled, toggled
    doc = json.loads(world.global_path.read_text())
    assert doc["piIcarusHook"]["contextDisplay"] is True and doc["piIcarusHook"]["hiddenDisplay"] is False
    assert doc["unrelated"] == "preserved"
    hidden = p.command("context default hide")["text"]
    assert "hidden by default for future Pi sessions" in hidden, hidden
    assert json.loads(world.global_path.read_text())["piIcarusHook"]["contextDisplay"] is False
    shown = p.command("context default show project")["text"]
    assert "visible by default for future Pi sessions" in shown and "project settings" in shown, shown
    assert str(world.project_path) in shown, shown
    assert json.loads(world.project_path.read_text())["piIcarusHook"]["contextDisplay"] is True


def test_a_scoped_context_default_status_says_the_default_and_where_it_comes_from(wired):  # noqa: F811
    world, _connect = wired
    world.write_global(contextDisplay=False)
    world.write_project({"contextDisplay": True})
    _w, p = _open(wired, trusted=True)
    project = p.command("context default status project")["text"]
    assert f"Startup default is visible from project settings ({world.project_path})" in project, project
    glob = p.command("context default global")["text"]  # a scope alone is a scoped status
    assert f"Startup default is hidden from global settings ({world.global_path})" in glob, glob
    world.write_global(classifier="none")  # the global layer no longer sets contextDisplay
    unset = p.command("context default status user")["text"]
    assert "Startup default is visible from built-in default" in unset, unset
    assert "not set in global settings" in unset and str(world.global_path) in unset, unset


def test_a_default_status_says_a_settings_file_it_cannot_read_is_ignored(wired):  # noqa: F811
    """A project file with a JSON slip (a trailing comma) where the user set the default: the
    status said "not set in project settings" and the effective default came from elsewhere with
    no word about the file. It now says the file is ignored and why."""
    world, _connect = wired
    world.write_global(contextDisplay=False)
    world.project_path.parent.mkdir(exist_ok=True)
    world.project_path.write_text('{"piIcarusHook": {"contextDisplay": true,}}')
    _w, p = _open(wired, trusted=True)
    scoped = p.command("context default status project")["text"]
    assert "not set in" not in scoped, scoped
    assert f"project settings are ignored (not valid JSON): {world.project_path}" in scoped, scoped
    effective = p.command("context default")["text"]
    assert f"Startup default is hidden from global settings ({world.global_path})" in effective, effective
    assert f"Project settings are ignored (not valid JSON): {world.project_path}" in effective, effective


def test_an_untrusted_sessions_project_default_status_is_the_effective_one_and_says_why(wired):  # noqa: F811
    world, _connect = wired
    world.write_global(contextDisplay=False)
    world.write_project({"contextDisplay": True})
    _w, p = _open(wired)  # untrusted: the project file is never read
    text = p.command("context default status project")["text"]
    assert f"Startup default is hidden from global settings ({world.global_path})" in text, text
    assert "untrusted" in text and str(world.project_path) in text, text


def test_the_schema_describes_each_runtime_env_variable_with_its_default(pi):
    _world, p = pi
    for schema in (json.loads(p.command("schema")["text"]),
                   p.tool("icarus_hook_config", {"schemaOnly": True})):
        env = schema["runtimeEnv"]
        assert set(env) == {"ICARUS_DIR", "ICARUS_PYTHON", "HERMES_HOME", "FABRIC_DIR", "HERMES_AGENT_NAME",
                            "FABRIC_PROJECT_ID", "STATE_DB_PATH"}
        assert env["ICARUS_DIR"]["default"] == "~/.hermes/plugins/icarus"
        assert env["ICARUS_PYTHON"]["default"] == "python3"
        assert env["FABRIC_DIR"]["default"] == "~/fabric"
        assert "default" not in env["STATE_DB_PATH"]  # unset unless configured: the backend decides
        assert all(isinstance(v["description"], str) and v["description"] for v in env.values())
        assert "ICARUS_DIR" not in schema["settings"]


def test_with_hooks_false_asking_status_or_off_is_information_and_the_rest_is_a_warning(wired):  # noqa: F811
    # Hooks that settings leave unregistered are already "off": asking their status or turning
    # them off is answered as information; turning them on or any context command is a warning.
    world, _connect = wired
    world.write_global(hooks=False)
    _w, p = _open(wired)
    levels = {args: p.command(args)["level"] for args in
              ("status", "off", "disable", "", "toggle", "on", "enable", "context", "context hide",
               "context default status")}
    assert levels == {"status": "info", "off": "info", "disable": "info", "": "warning", "toggle": "warning",
                      "on": "warning", "enable": "warning", "context": "warning", "context hide": "warning",
                      "context default status": "warning"}, levels


def test_a_tool_whose_backend_raises_is_an_error_with_its_text_and_the_worker_stays(pi):
    # A Python exception in a tool is a failed call (Pi marks it failed), never a tool value;
    # its message is the backend's own text; the worker (and its module state) is kept.
    world, p = pi
    assert p.tool("fabric_write", {"type": "note", "summary": "KEPT", "content": "x"})["status"] == "written"
    pid = p.client.call("ops.worker", {"session_id": SID})["worker"]["process"]["pid"]
    world.controls({"tools.fabric_search": {"raise": "search index is locked"}})
    with pytest.raises(CastorError) as raised:
        p.tool("fabric_search", {"query": "KEPT"})
    assert raised.value.code == "internal" and raised.value.message == "search index is locked", raised.value
    world.controls({})
    assert p.tool("fabric_search", {"query": "KEPT"})["count"] == 1
    assert p.client.call("ops.worker", {"session_id": SID})["worker"]["process"]["pid"] == pid


def test_a_tool_timeout_is_an_error_naming_the_call_and_the_next_call_gets_a_fresh_worker(wired):  # noqa: F811
    world, _connect = wired
    # 2 s: each fresh worker's cold start is inside its first call's deadline, and a loaded host
    # took over 500 ms for one (the old 500 ms deadline failed about one run in three there).
    world.write_global(timeoutMs=2000)
    _w, p = _open(wired)
    assert p.tool("fabric_brief", {}) is not None
    pid = p.client.call("ops.worker", {"session_id": SID})["worker"]["process"]["pid"]
    world.controls({"tools.fabric_search": {"sleep_ms": 8000}})
    with pytest.raises(CastorError) as raised:
        p.tool("fabric_search", {"query": "q"})
    assert raised.value.code == "timeout" and "tools.fabric_search" in raised.value.message, raised.value
    wait_until(lambda: gone(pid), 5, "the timed-out worker was retired")
    world.controls({})
    assert p.tool("fabric_search", {"query": "q"})["count"] == 0
    assert p.client.call("ops.worker", {"session_id": SID})["worker"]["process"]["pid"] != pid
    assert len(world.calls("tools.fabric_search")) == 2  # the timed-out call was never re-sent


def test_a_harness_without_a_model_registry_keeps_the_context_and_audits_no_registry(wired):  # noqa: F811
    # The Pi extension answers model.list `unsupported` when Pi has no model registry
    # (integrations/pi/src/models.ts): filtering is skipped, not failed.
    world, connect = wired
    world.seed(("chocolate cake recipe", "eggs"))
    client, harness = connect()

    def no_registry(_params: dict[str, Any]) -> dict[str, Any]:
        err = CastorError("this Pi has no model registry")
        err.code = "unsupported"  # type: ignore[assignment]  # the extension's own wire code, not one of castor's
        raise err

    client.on_request("model.list", no_registry)
    open_session(client, world, SID)
    result = Pi(client, harness).prompt("cake")
    assert "chocolate cake recipe" in result["message"]["content"]
    [entry] = harness.entries
    assert (entry["data"]["outcome"], entry["data"]["reason"]) == ("fallback", "no_registry"), entry


def test_a_session_pi_gave_no_id_sends_icarus_an_empty_id_and_every_start_runs(wired):  # noqa: F811
    # Pi without a session id: the extension opens the castor session under an id of its own and
    # says the harness had none (flags.harness_session_id ""). Icarus then gets session_id "" in
    # every hook, and a repeated session_start is not deduplicated (an empty id names no session).
    world, connect = wired
    client, harness = connect()
    client.call("session.open", {"session_id": SID, "cwd": str(world.project), "trusted": False,
                                 "flags": {"harness": "pi", "has_agent_settled": True, "harness_session_id": ""}})
    p = Pi(client, harness)
    for _ in range(2):
        assert p.event("session_start", reason="startup") == {}
    assert [c["kwargs"] for c in world.calls("hooks.on_session_start")] == [{"session_id": "", "platform": "pi"}] * 2
    p.prompt("first ask")
    [retrieval] = world.calls("hooks.pre_llm_call")
    assert retrieval["kwargs"] == {"session_id": "", "user_message": "first ask", "is_first_turn": True}
    p.agent_end(("user", "first ask", None), ("assistant", "answer", "stop"))
    p.event("agent_settled", aborted=False)
    assert p.event("session_shutdown", reason="quit") == {}
    assert world.calls("hooks.post_llm_call")[0]["kwargs"]["session_id"] == ""
    assert world.calls("hooks.on_session_end")[0]["kwargs"] == {"session_id": "", "platform": "pi"}


def test_a_harness_session_id_in_the_flags_is_the_id_icarus_gets(wired):  # noqa: F811
    world, connect = wired
    client, harness = connect()
    client.call("session.open", {"session_id": SID, "cwd": str(world.project), "trusted": False,
                                 "flags": {"harness": "pi", "harness_session_id": "pi-manager-id"}})
    p = Pi(client, harness)
    for _ in range(2):
        p.event("session_start", reason="startup")
    assert [c["kwargs"] for c in world.calls("hooks.on_session_start")] == [
        {"session_id": "pi-manager-id", "platform": "pi"}]  # a known id: deduplicated


def test_51_a_usage_the_extension_sends_with_every_figure_unknown_is_audited_as_none(wired):  # noqa: F811
    # The Pi extension always answers classifier.complete with a usage map, each figure null when
    # Pi's reply had none (integrations/pi/src/index.ts classifierComplete): no figure known is no
    # usage reported, so the audit says null, as for a harness that sends none.
    world, connect = wired
    world.seed(("sqlite WAL notes", "WAL"), ("chocolate cake recipe", "eggs"))
    client, harness = connect()
    inner = harness.complete

    def complete(params: dict[str, Any]) -> dict[str, Any]:
        return {**inner(params), "usage": {"input": None, "output": None, "cache_read": None, "cache_write": None,
                                           "total_tokens": None, "cost": None}}

    client.on_request("classifier.complete", complete)
    open_session(client, world, SID)
    Pi(client, harness).prompt("sqlite cake")
    [entry] = harness.entries
    assert entry["data"]["outcome"] == "filtered" and entry["data"]["usage"] is None, entry["data"]["usage"]


@pytest.mark.parametrize("named", ["../../etc", "a/b", 7, "x" * 200])
def test_a_harness_session_id_that_is_not_a_safe_id_is_refused_at_open(wired, named):  # noqa: F811
    world, connect = wired
    client, _harness = connect()
    with pytest.raises(CastorError) as refused:
        client.call("session.open", {"session_id": SID, "cwd": str(world.project), "trusted": False,
                                     "flags": {"harness": "pi", "harness_session_id": named}})
    assert refused.value.code == "forbidden" and "harness_session_id" in refused.value.message, refused.value
    opened = client.call("session.open", {"session_id": SID, "cwd": str(world.project), "trusted": False,
                                          "flags": {"harness": "pi", "harness_session_id": ""}})
    assert opened["session_id"] == SID  # nothing of the refused open was kept


OLDER_ICARUS = REFERENCE_ICARUS.parents[2] / "tests" / "support" / "icarus_packages" / "older_icarus" / "icarus"


def test_a_package_without_a_hook_or_tool_says_so_once_and_the_tool_is_not_found(wired):  # noqa: F811 - the shared fixture
    """An older or customised Icarus without ``pre_llm_call`` or ``fabric_brief``: every prompt
    warned "failed in the memory backend" and the tool answered ``internal`` ("may have started",
    castor's own traceback). Now the tool is ``not_found`` (``missing_function``, nothing ran) and
    the hooks run without the missing function, said once per function for the session."""
    world, connect = wired
    world.write_global(icarusDir=str(OLDER_ICARUS), classifier="none")
    client, harness = connect()
    open_session(client, world, SID)
    p = Pi(client, harness)
    assert p.event("session_start", reason="startup") == {}
    assert [p.prompt(f"prompt {n}") for n in range(3)] == [{}, {}, {}]
    with pytest.raises(CastorError) as missing:
        p.tool("fabric_brief", {})
    assert missing.value.code == "not_found"
    assert missing.value.data == {"reason": "missing_function", "target": "tools.fabric_brief",
                                  "may_have_started": False}
    pid = client.call("ops.worker", {"session_id": SID})["worker"]["process"]["pid"]
    assert p.tool("fabric_search", {"query": "q"})["count"] == 0  # the same worker serves the rest
    assert client.call("ops.worker", {"session_id": SID})["worker"]["process"]["pid"] == pid
    assert p.event("session_shutdown", reason="quit") == {}

    def warnings_said() -> list[str]:
        return [n["message"] for m, n in harness.notes if m == "ui.notify"]

    # The client runs a notification's handler on a worker thread: the last one may land just
    # after the reply it was sent before.
    wait_until(lambda: len(warnings_said()) >= 2, 5, "the on_session_end warning")
    warnings = warnings_said()
    assert len(warnings) == 2, warnings  # pre_llm_call once, on_session_end once
    assert "hooks.pre_llm_call" in warnings[0] and "hooks.on_session_end" in warnings[1]
    assert all("failed in the memory backend" not in w for w in warnings)

