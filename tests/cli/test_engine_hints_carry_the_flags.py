"""The commands castor's own messages name during a CLI run (the engine's, shown as ``[info]`` /
``[warning]`` lines) carry the flags the user typed, as the CLI's closing lines do: typed as shown
they find the same cast. The engine spells them ``castor continue ID`` knowing nothing of the
command line, so a user who ran ``castor cast ... --cwd DIR`` from elsewhere was told a command
that answered ``not_found``."""

from __future__ import annotations

import json
import shlex

from tests.cli.interrupted_cast import castor_cli

MULTI_TURN = {"activeLoadout": "One", "materia": {"planner": {"prompt": "plan {{request}}", "tools": "none",
                                                              "multiTurn": True}},
              "loadouts": {"One": {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent",
                                                                                 "materia": "planner"}}}}}


def test_a_multi_turn_pause_names_castor_continue_with_the_project_the_user_named(tmp_path):
    project = tmp_path / "my project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(MULTI_TURN))
    (project / "answers.json").write_text(json.dumps(["a plan", "the final plan"]))
    ran = castor_cli(tmp_path, "cast", "plan it", "--agent", f"script:{project / 'answers.json'}",
                     "--cwd", str(project), "--quiet", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    [run] = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    paused = next(line for line in ran.stderr.splitlines() if "waiting for refinement" in line)
    assert f"run castor continue {run.name} --cwd {shlex.quote(str(project))} to finalize" in paused, paused


def test_the_flags_are_in_place_before_the_cast_can_say_anything(tmp_path, monkeypatch, capsys):
    """A cast's first notices can come before its start is answered (its first transition's effects
    and visits run on the cast's own thread once its first save is durable): the rewrite must be in
    place when the start is asked, not after it returns. It was set after, and a quick multi-turn
    cast's pause notice came out without ``--cwd`` now and then."""
    from castor.cli import materia

    project = tmp_path / "my project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(MULTI_TURN))
    (project / "answers.json").write_text(json.dumps(["a plan", "the final plan"]))
    seen: list[str | None] = []
    real_call = materia._Standalone.call

    def call(self, verb, params=None):
        if verb == "start":
            spell = self.ui.spell if self.ui is not None else None
            seen.append(spell("see castor status 2026-12-07T10-00-00-000Z") if spell else None)
        return real_call(self, verb, params)

    monkeypatch.setattr(materia._Standalone, "call", call)
    monkeypatch.chdir(tmp_path)
    from castor.cli import main

    assert main(["cast", "plan it", "--agent", f"script:{project / 'answers.json'}", "--cwd", str(project),
                 "--quiet"]) == 0
    assert seen == [f"see castor status 2026-12-07T10-00-00-000Z --cwd {shlex.quote(str(project))}"]
