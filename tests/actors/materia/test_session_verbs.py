"""Every SessionActor verb is one typed message with its own handler, and the endpoint's materia
methods are one table of (params model, message): a verb cannot be reached by a name or argument
its message does not declare."""

from __future__ import annotations

import time

import pytest

from castor.actors.materia.api import materia_ask, materia_call, verb_message
from castor.actors.materia.messages import SESSION_VERBS, ListCasts, SessionVerb, StartCast, ValidateConfig
from castor.actors.materia.session_actor import SessionActor
from castor.endpoint.methods.materia import METHODS
from castor.messages.errors import Conflict, Forbidden, InvalidParams

from .helpers import open_session


def test_every_verb_is_a_message_with_its_own_handler() -> None:
    assert all(issubclass(cls, SessionVerb) and SESSION_VERBS[cls.verb] is cls for cls in SESSION_VERBS.values())
    handlers = {cls: SessionActor._dispatch[cls] for cls in SESSION_VERBS.values()}
    assert len(set(handlers.values())) == len(SESSION_VERBS)  # one handler each, no shared dispatcher


def test_the_endpoint_table_builds_each_methods_message_from_its_params() -> None:
    samples = {"request": "do it", "name": "hello", "path": "materia.json", "cast_id": "c1", "limit": 5}
    sent = {}
    for name, method in METHODS.items():
        fields = {k: v for k, v in samples.items() if k in method.params.model_fields}
        message = method.message(method.params(session_id="s1", **fields))
        assert isinstance(message, SessionVerb)
        sent[name] = message.verb
        assert message.arguments() == fields
    assert sent == {"cast.start": "start", "cast.abort": "abort", "cast.continue": "continue",
                    "cast.recast": "recast", "cast.revive": "revive", "cast.status": "status", "cast.list": "list",
                    "loadout.list": "loadouts", "loadout.set": "set_loadout", "grid.render": "grid",
                    "config.validate": "validate"}


def test_a_verb_by_name_is_its_message_and_bad_arguments_are_invalid_params() -> None:
    assert verb_message("start", {"request": "x", "loadout": None}) == StartCast(request="x")
    with pytest.raises(InvalidParams, match="unknown materia verb"):
        verb_message("explode")
    with pytest.raises(InvalidParams) as missing:
        verb_message("start", {})
    assert missing.value.data == {"verb": "start"}
    with pytest.raises(InvalidParams) as extra:
        verb_message("status", {"cast_id": "c1", "colour": "red"})
    assert extra.value.data == {"verb": "status"}


def test_the_typed_ask_and_the_call_by_name_give_one_answer(runtime_factory, project) -> None:
    rt = runtime_factory()
    open_session(rt, "s1", project, [])
    assert materia_ask(rt, "s1", ListCasts()) == materia_call(rt, "s1", "list")
    with pytest.raises(Forbidden, match="NUL byte"):
        materia_ask(rt, "s1", ValidateConfig(path="materia\x00.json"))  # a path no file system holds
    assert materia_ask(rt, "s1", ListCasts())["casts"] == []  # answered and survived


def test_status_texts_in_the_harness_name_commands_the_extension_accepts() -> None:
    """The extension's /materia continue, abort and status take no argument (an id gets its usage
    text back); recast and revive take one. A status block names each the way the user can type it."""
    from castor.actors.materia.views import status_text

    view = {"cast_id": "c-1", "run_dir": "/r", "loadout": "L"}
    interrupted = status_text({**view, "status": "interrupted"}, "harness")
    assert "run /materia continue to run the turn again, or /materia abort to stop the cast" in interrupted
    paused = status_text({**view, "status": "active", "paused": True}, "harness")
    assert "› waiting for refinement; /materia continue to finalize" in paused  # no id: as the user types it
    failed = status_text({**view, "status": "failed", "resumable": True}, "harness")
    assert "/materia recast c-1" in failed
    cli = status_text({**view, "status": "interrupted"}, "cli")
    assert "castor continue c-1" in cli and "castor abort c-1" in cli


def test_a_cast_its_budget_stopped_says_in_its_status_and_the_cli_that_a_recast_stops_again(capsys) -> None:
    """Its hint offered a recast as if it resumed the cast: a recast keeps what was spent and the
    budget, so the next socket (paid for) ended in the same stop."""
    from castor.actors.materia.views import status_text
    from castor.cli.materia import EXIT_FAILED, _finish
    from castor.domain.materia.engine import BUDGET_LIMIT_REACHED, BUDGET_RECAST_NOTE

    view = {"cast_id": "c-1", "run_dir": "/r", "loadout": "L", "status": "failed", "resumable": True,
            "failed_reason": BUDGET_LIMIT_REACHED}
    assert f"budget: {BUDGET_RECAST_NOTE}" in status_text(view, "harness").splitlines()
    assert _finish(view, "") == EXIT_FAILED
    err = capsys.readouterr().err
    assert f"failed: {BUDGET_LIMIT_REACHED}; {BUDGET_RECAST_NOTE} (`castor recast c-1` resumes it)" in err


class _AgentThatNeverAnswers:
    """A harness whose turns never end: every cast started stays live and active."""

    def run_turn(self, request, reply) -> None:
        pass

    def abort_turn(self, turn_id) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.timeout(60)
def test_a_start_below_the_session_s_cast_limit_asks_no_live_cast_and_at_the_limit_still_refuses(
        runtime_factory, project) -> None:
    """A start asked every live cast of its session for its status to count the active ones: one
    round trip per cast the session runs (99 for the hundredth start). Fewer live casts than the
    limit cannot be that many active ones, so none is asked then; at the limit they are, and the
    start is refused as before."""
    from castor.runtime import HarnessLink, SessionInfo

    rt = runtime_factory(max_casts_per_session=4)
    rt.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True),
                    HarnessLink(agent=_AgentThatNeverAnswers(), session_log=None, ui=None))
    started = [materia_call(rt, "s1", "start", {"request": f"c{n}", "loadout": "hello"})["cast_id"]
               for n in range(3)]
    casts = [rt.system.lookup(f"/root/session/s1/cast/{cast_id}") for cast_id in started]
    deadline = time.monotonic() + 30  # each cast's first message: its first transition's effects (PerformSavedStart)
    while any(handle.snapshot().mailbox.processed < 1 for handle in casts) and time.monotonic() < deadline:
        time.sleep(0.01)
    before = [handle.snapshot().mailbox.processed for handle in casts]
    assert before == [1, 1, 1]
    started.append(materia_call(rt, "s1", "start", {"request": "c3", "loadout": "hello"})["cast_id"])
    assert [handle.snapshot().mailbox.processed for handle in casts] == before  # none was asked
    with pytest.raises(Conflict) as refused:  # four live, four active: the fifth is refused
        materia_call(rt, "s1", "start", {"request": "c4", "loadout": "hello"})
    assert refused.value.data["reason"] == "active" and refused.value.data["cast_id"] == max(started)


def test_config_validate_checks_the_layers_a_cast_of_the_session_runs(runtime_factory, project, tmp_path,
                                                                      monkeypatch) -> None:
    """``config.validate`` of the project's file layers it as the session's casts do: the
    session's ``--materia-config`` above it (its activeLoadout chooses the loadout the cast runs,
    here one the explicit file defines)."""
    from castor.adapters.agents.scripted import ScriptedAgent, parse_script
    from castor.adapters.stderr_ui import StderrUi
    from castor.runtime import HarnessLink, SessionInfo

    monkeypatch.setenv("PI_MATERIA_PROFILE_DIR", str(tmp_path / "profile"))
    monkeypatch.delenv("MATERIA_CONFIG", raising=False)
    (project / ".pi").mkdir()
    (project / ".pi" / "pi-materia.json").write_text('{"materia": {"Mine": {"prompt": "p", "tools": "none"}}}')
    (project / "mine.json").write_text('{"activeLoadout": "Mine-L", "loadouts": {"Mine-L": {"sockets": '
                                       '{"Socket-1": {"type": "agent", "materia": "Mine"}}}}}')
    rt = runtime_factory()
    rt.open_session(SessionInfo(session_id="s1", cwd=str(project), trusted=True,
                                flags={"materia_config": "mine.json"}),
                    HarnessLink(agent=ScriptedAgent(parse_script([])), session_log=None,
                                ui=StderrUi(printer=lambda _line: None)))
    answer = materia_ask(rt, "s1", ValidateConfig(path=".pi/pi-materia.json"))
    assert answer["ok"] is True, answer["errors"]
    (project / "mine.json").write_text('{"activeLoadout": "Nope"}')
    answer = materia_ask(rt, "s1", ValidateConfig(path=".pi/pi-materia.json"))
    assert answer["ok"] is False and "Nope" in answer["text"] and "mine.json" in answer["text"]
