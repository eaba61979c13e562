"""pi-materia's own shipped configs, used unchanged as a castor project config.

The fixtures (pi-materia's bundled ``default.json`` and its graph-semantics example) are read at
test time from ``$CASTOR_SHARED_DIR/fixtures/pi-materia/``, ``<repo root>/../shared/...`` or, in a
clone of a local checkout (``git clone . /tmp/x``), ``<that checkout>/../shared/...``, and never
copied into castor. Without them these tests fail under ``CI=true`` and skip otherwise.

Every test drives the CLI (``python -m castor ...``) in a fresh temporary project whose
``.pi/pi-materia.json`` holds the fixture's bytes, with the scripted agent standing in for a model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from castor.domain.materia.defaults import DEFAULT_LABEL, default_config
from castor.domain.materia.resolve import load_config, resolve_config
from tests.support.pi_materia import fixture_path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = ("default.json", "graph-semantics-loadout.json")
UI_FIELDS = {"label", "description", "group", "color"}


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
            "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}


def castor(tmp_path: Path, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=cwd, env=_env(tmp_path), text=True,
                          capture_output=True, timeout=timeout)


def project_with(tmp_path: Path, fixture: str, name: str = "project") -> Path:
    project = tmp_path / name
    (project / ".pi").mkdir(parents=True)
    shutil.copyfile(fixture_path(fixture), project / ".pi" / "pi-materia.json")
    return project


def fixture_json(fixture: str) -> dict[str, Any]:
    return json.loads(fixture_path(fixture).read_text(encoding="utf-8"))


def _layers(fixture: str) -> list[tuple[str, dict[str, Any]]]:
    return [(DEFAULT_LABEL, default_config()), (fixture, fixture_json(fixture))]


# --------------------------------------------------------------------------- answers for a loadout

WORK_ITEM = {"id": "alpha", "title": "Alpha", "description": "Make alpha.", "acceptance": ["alpha works"],
             "context": {"architecture": "", "constraints": [], "dependencies": [], "risks": []}}


def script_for(fixture: str | None, loadout: str, *, work_items: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A socket-keyed answer script that satisfies every socket of ``loadout`` (JSON sockets get
    a valid envelope; generators the work items; multi-turn sockets one refinement reply, then the
    final JSON the CLI's finalization asks for). ``fixture`` None: castor's bundled layer alone."""
    layers = _layers(fixture) if fixture else [(DEFAULT_LABEL, default_config())]
    pipeline = resolve_config(load_config(layers), loadout).pipeline
    items = [WORK_ITEM] if work_items is None else work_items
    script: dict[str, list[Any]] = {}
    for sid, rs in pipeline.sockets.items():
        if not rs.is_agent:
            continue
        if not rs.socket.is_json:
            answer: Any = f"{sid} did its part."
        elif rs.is_generator:
            answer = json.dumps({"summary": "planned", "workItems": items, "satisfied": True})
        else:
            answer = json.dumps({"summary": f"{sid} checked", "satisfied": True, "feedback": "", "missing": [],
                                 "checkpointCreated": False})
        script[sid] = ([f"{sid}: let us refine the plan."] if rs.multi_turn else []) + [answer] * 6
    return script


def run_cast(
    tmp_path: Path, project: Path, loadout: str, script: dict[str, Any]
) -> tuple[subprocess.CompletedProcess[str], Path]:
    (project / "answers.json").write_text(json.dumps(script))
    before = (
        {p.name for p in (project / ".pi" / "pi-materia").iterdir()}
        if (project / ".pi" / "pi-materia").is_dir()
        else set()
    )
    result = castor(tmp_path, "cast", "Add the alpha feature", "--quiet", "--loadout", loadout,
                    "--agent", "script:answers.json", cwd=project, timeout=180)
    runs = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir() and p.name not in before]
    assert len(runs) == 1, (result.stdout, result.stderr)
    return result, runs[0]


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def started(run_dir: Path) -> list[str]:
    return [e["data"]["socket"] for e in events(run_dir) if e["type"] == "socket_start"]


# --------------------------------------------------------------------------- load, validate, grid


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fixture", FIXTURES)
def test_the_fixture_loads_unchanged_validates_and_every_loadout_renders_in_the_grid(
    tmp_path: Path, fixture: str
) -> None:
    project = project_with(tmp_path, fixture)
    original = (project / ".pi" / "pi-materia.json").read_bytes()
    checked = castor(tmp_path, "validate", ".pi/pi-materia.json", cwd=project)
    assert checked.returncode == 0, checked.stderr
    assert "valid" in checked.stdout and "[warning" not in checked.stderr, checked.stderr
    names = list(fixture_json(fixture)["loadouts"])
    assert names
    for name in names:
        grid = castor(tmp_path, "grid", "--loadout", name, cwd=project)
        assert grid.returncode == 0, grid.stderr
        assert f"loadout {name}" in grid.stdout.splitlines()[0]
        for sid in fixture_json(fixture)["loadouts"][name]["sockets"]:
            assert f"{sid}: " in grid.stdout, (name, sid)
    default_grid = castor(tmp_path, "grid", cwd=project)  # the fixture's own activeLoadout
    assert default_grid.returncode == 0 and fixture_json(fixture)["activeLoadout"] in default_grid.stdout
    assert (project / ".pi" / "pi-materia.json").read_bytes() == original  # loading never writes


def _cast_cases() -> list[tuple[str, str]]:
    cases = []
    for fixture in FIXTURES:
        try:
            names = list(fixture_json(fixture)["loadouts"])
        except BaseException:  # a missing fixture: the single case below fails or skips in the test
            names = ["<fixture missing>"]
        cases += [(fixture, name) for name in names]
    return cases


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("fixture", "loadout"), _cast_cases())
def test_a_scripted_cast_of_every_loadout_completes(tmp_path: Path, fixture: str, loadout: str) -> None:
    project = project_with(tmp_path, fixture)
    result, run_dir = run_cast(tmp_path, project, loadout, script_for(fixture, loadout))
    assert result.returncode == 0, result.stderr
    assert "complete" in result.stdout
    kinds = [e["type"] for e in events(run_dir)]
    assert kinds[0] == "cast_start" and kinds[-1] == "cast_end" and "config_warning" not in kinds
    assert events(run_dir)[-1]["data"]["ok"] is True
    # Every socket of the loadout ran (one work item: each loop member once).
    assert set(started(run_dir)) == set(fixture_json(fixture)["loadouts"][loadout]["sockets"])
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert state["phase"] == "complete" and state["cursors"].get("workItemIndex") == 1


@pytest.mark.timeout(240)
@pytest.mark.parametrize("loadout", ["Full-Auto", "Planning-Consult", "Hojo-Consult"])
def test_castors_own_bundled_pi_materia_loadouts_run_with_no_project_config(tmp_path: Path, loadout: str) -> None:
    project = tmp_path / "project"
    project.mkdir()
    result, run_dir = run_cast(tmp_path, project, loadout, script_for(None, loadout))
    assert result.returncode == 0, result.stderr
    assert set(started(run_dir)) == set(default_config()["loadouts"][loadout]["sockets"])
    contexts = "".join(p.read_text() for p in (run_dir / "contexts").iterdir())
    assert "Add the alpha feature" in contexts and "{{" not in contexts  # castor's prompts, rendered


@pytest.mark.timeout(240)
def test_an_empty_work_list_ends_full_auto_at_the_loop_without_narrate_as_in_pi_materia(tmp_path: Path) -> None:
    """The loop is entered at Build, which has no exit route of its own: the cast ends there,
    exactly as in pi-materia (castor's own bundled ``build`` declares a route for that case)."""
    project = project_with(tmp_path, "default.json")
    result, run_dir = run_cast(tmp_path, project, "Full-Auto", script_for("default.json", "Full-Auto", work_items=[]))
    assert result.returncode == 0, result.stderr
    assert started(run_dir) == ["Socket-1", "Socket-2", "Socket-3", "Socket-8"]  # no Build, no Narrate
    assert events(run_dir)[-1]["data"]["ok"] is True


# --------------------------------------------------------------------------- bundled names and layering


@pytest.mark.timeout(240)
def test_a_project_config_naming_only_bundled_names_runs_on_castors_bundled_layer(tmp_path: Path) -> None:
    """No definitions of its own: ``activeLoadout: "Full-Auto"`` and a loadout built from
    pi-materia's bundled materia names both load and run on castor's bundled layer."""
    names = fixture_json("default.json")
    bundled = default_config()
    assert set(names["materia"]) <= set(bundled["materia"]) and set(names["loadouts"]) <= set(bundled["loadouts"])
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    own = {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "interactivePlan", "parse": "json",
                     "assign": {"workItems": "$.workItems"}, "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "Build", "edges": [{"when": "always", "to": "Socket-3"}]},
        "Socket-3": {"type": "agent", "materia": "Auto-Eval", "parse": "json",
                     "edges": [{"when": "not_satisfied", "to": "Socket-2"}, {"when": "always", "to": "Socket-4"}]},
        "Socket-4": {"type": "agent", "materia": "Narrate"}}}
    (project / ".pi" / "pi-materia.json").write_text(json.dumps({"activeLoadout": "Full-Auto",
                                                                 "loadouts": {"Mine": own}}))
    grid = castor(tmp_path, "grid", cwd=project)
    assert grid.returncode == 0 and "loadout Full-Auto" in grid.stdout, grid.stderr
    result, run_dir = run_cast(tmp_path, project, "Full-Auto", {
        "Socket-3": [json.dumps({"workItems": [WORK_ITEM]})], "Socket-8": [json.dumps({"workItems": [WORK_ITEM]})],
        "Socket-4": ["built"], "Socket-5": [json.dumps({"satisfied": True})],
        "Socket-6": [json.dumps({"satisfied": True})], "Socket-7": ["the story"]})
    assert result.returncode == 0, result.stderr
    assert started(run_dir)[-1] == "Socket-7"
    result, run_dir = run_cast(tmp_path, project, "Mine", {
        "Socket-1": ["let us talk", json.dumps({"workItems": [WORK_ITEM]})], "Socket-2": ["built"],
        "Socket-3": [json.dumps({"satisfied": True})], "Socket-4": ["the story"]})
    assert result.returncode == 0, result.stderr
    assert started(run_dir) == ["Socket-1", "Socket-2", "Socket-3", "Socket-4"]


def _runtime_fields(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in UI_FIELDS}


@pytest.mark.parametrize("fixture", FIXTURES)
def test_pi_materias_own_definitions_as_a_layer_get_no_bundled_setting_pi_materia_would_not_give(fixture: str) -> None:
    """pi-materia merges a layer's materia over its bundled ones field by field. With its own
    ``default.json`` (or its example) layered over castor's bundled layer, every materia it
    defines must end up with exactly the runtime settings pi-materia gives it: its own fields,
    plus — for a partial definition — only what pi-materia's bundled definition of that name has."""
    pi_bundled = fixture_json("default.json")["materia"]
    layer = fixture_json(fixture)["materia"]
    merged = load_config(_layers(fixture)).merged["materia"]
    for name, entry in layer.items():
        expected = _runtime_fields({**pi_bundled.get(name, {}), **entry})
        got = _runtime_fields(merged[name])
        if "prompt" not in entry:
            expected.pop("prompt", None)
            got.pop("prompt", None)  # the bundled prompt: castor's own words, by design
        assert got == expected, name
    resolved = resolve_config(load_config(_layers(fixture)))
    for rs in resolved.pipeline.sockets.values():
        if rs.materia is not None and rs.materia_name in layer:
            assert rs.materia.thinking == {**pi_bundled.get(rs.materia_name, {}),
                                           **layer[rs.materia_name]}.get("thinking"), rs.materia_name


def test_pi_materias_default_json_as_a_layer_merges_to_exactly_its_own_definitions() -> None:
    """Every key castor's bundled definition of a pi-materia name has, pi-materia's has too, so
    layering pi-materia's whole bundled default over castor's gives pi-materia's definitions
    exactly — not one field (not even a UI label) of castor's left in them."""
    from castor.domain.materia.graph import normalize_loadout

    pi = fixture_json("default.json")
    ours = default_config()
    for name, entry in pi["materia"].items():
        assert set(ours["materia"][name]) <= set(entry), name
    merged = load_config(_layers("default.json")).merged
    for name, entry in pi["materia"].items():
        assert merged["materia"][name] == entry, name
    for name, loadout in pi["loadouts"].items():
        prepared = load_config([("pi-only", pi)]).merged["loadouts"][name]
        assert merged["loadouts"][name] == prepared, name
        assert normalize_loadout(loadout)["sockets"].keys() == merged["loadouts"][name]["sockets"].keys()
    for key in ("activeLoadout", "artifactDir", "limits", "budget"):
        assert merged[key] == pi[key], key


def test_castors_bundled_definitions_of_pi_materias_names_match_pi_materias_settings() -> None:
    """Structure and settings as data: every bundled materia and loadout named like one of
    pi-materia's has pi-materia's settings (UI labels, prompts and the editor's layout aside)."""
    from castor.domain.materia.graph import normalize_loadout

    pi = fixture_json("default.json")
    ours = default_config()
    for name, entry in pi["materia"].items():
        assert _runtime_fields({k: v for k, v in ours["materia"][name].items() if k != "prompt"}) == \
            _runtime_fields({k: v for k, v in entry.items() if k != "prompt"}), name
    for name, loadout in pi["loadouts"].items():
        theirs, mine = normalize_loadout(loadout), normalize_loadout(ours["loadouts"][name])
        theirs.pop("layout", None)
        for loops in (theirs.get("loops", {}), mine.get("loops", {})):
            for loop in loops.values():
                loop.pop("label", None)
        assert mine == theirs, name
    assert ours["limits"] == pi["limits"] and ours["budget"] == pi["budget"]
    for name, entry in ours["materia"].items():
        prompt = entry.get("prompt")
        if name in pi["materia"] and prompt is not None:
            assert prompt != pi["materia"][name].get("prompt"), name  # castor's own words


# --------------------------------------------------------------------------- castor loadout NAME


@pytest.mark.timeout(120)
def test_castor_loadout_changes_only_the_active_loadout_value_of_pi_materias_file(tmp_path: Path) -> None:
    project = project_with(tmp_path, "default.json")
    target = project / ".pi" / "pi-materia.json"
    original = target.read_text(encoding="utf-8")
    target.chmod(0o640)
    result = castor(tmp_path, "loadout", "Planning-Consult", cwd=project)
    assert result.returncode == 0, result.stderr
    edited = target.read_text(encoding="utf-8")
    assert edited == original.replace('"activeLoadout": "Full-Auto"', '"activeLoadout": "Planning-Consult"', 1)
    assert "→" in edited and "\\u2192" not in edited
    assert json.loads(edited) == {**json.loads(original), "activeLoadout": "Planning-Consult"}
    assert target.stat().st_mode & 0o777 == 0o640
    back = castor(tmp_path, "loadout", "Full-Auto", cwd=project)
    assert back.returncode == 0 and target.read_text(encoding="utf-8") == original


@pytest.mark.timeout(120)
def test_castor_loadout_inserts_an_absent_key_and_keeps_the_rest(tmp_path: Path) -> None:
    project = project_with(tmp_path, "graph-semantics-loadout.json")
    target = project / ".pi" / "pi-materia.json"
    data = json.loads(target.read_text(encoding="utf-8"))
    data.pop("activeLoadout")
    body = json.dumps(data, indent=4, ensure_ascii=False)  # the user's own style: 4 spaces
    target.write_text(body + "\n", encoding="utf-8")
    result = castor(tmp_path, "loadout", "Graph Semantics Example", cwd=project)
    assert result.returncode == 0, result.stderr
    edited = target.read_text(encoding="utf-8")
    assert edited == body[:-2] + ',\n    "activeLoadout": "Graph Semantics Example"\n}\n'
    assert "→" in edited


@pytest.mark.timeout(120)
def test_an_unknown_loadout_leaves_the_file_byte_for_byte(tmp_path: Path) -> None:
    project = project_with(tmp_path, "default.json")
    target = project / ".pi" / "pi-materia.json"
    original = target.read_bytes()
    result = castor(tmp_path, "loadout", "Nope", cwd=project)
    assert result.returncode == 1 and "Unknown Materia loadout" in result.stderr
    assert target.read_bytes() == original


@pytest.mark.timeout(120)
def test_castor_loadout_through_a_symlinked_config_never_writes_outside_the_project(tmp_path: Path) -> None:
    """A project's `.pi/pi-materia.json` that links to a file outside the project is not read at
    all (a checkout could link it to a JSON file of the user's -- ~/.docker/config.json holds
    tokens -- and `castor loadout` would copy it into the project, to be committed): refused,
    nothing written anywhere, the link left. A link that stays inside the project is read."""
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    outside = tmp_path / "elsewhere.json"
    shutil.copyfile(fixture_path("default.json"), outside)
    original = outside.read_bytes()
    (project / ".pi" / "pi-materia.json").symlink_to(outside)
    result = castor(tmp_path, "loadout", "Hojo-Consult", cwd=project)
    assert result.returncode == 1 and "path-escapes-project" in result.stderr, result.stderr
    assert outside.read_bytes() == original  # the link's target is untouched
    assert (project / ".pi" / "pi-materia.json").is_symlink()
    assert sorted(p.name for p in (project / ".pi").iterdir()) == ["pi-materia.json"]
    (project / ".pi" / "pi-materia.json").unlink()
    inside = project / "shared-materia.json"
    shutil.copyfile(fixture_path("default.json"), inside)
    (project / ".pi" / "pi-materia.json").symlink_to(inside)
    result = castor(tmp_path, "loadout", "Hojo-Consult", cwd=project)
    assert result.returncode == 0, result.stderr
    written = (project / ".pi" / "pi-materia.json").read_text(encoding="utf-8")
    assert '"activeLoadout": "Hojo-Consult"' in written


@pytest.mark.timeout(120)
def test_castor_loadout_refuses_a_file_that_is_not_json_and_leaves_it(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    target = project / ".pi" / "pi-materia.json"
    target.write_text('{"activeLoadout": "build", oops')
    result = castor(tmp_path, "loadout", "build", cwd=project)
    assert result.returncode == 1 and "invalid_config" in result.stderr and "Traceback" not in result.stderr
    assert target.read_text() == '{"activeLoadout": "build", oops'


@pytest.mark.timeout(120)
def test_two_castor_loadout_runs_at_once_leave_one_whole_edit(tmp_path: Path) -> None:
    """Each write is a complete temp file renamed over the config: whichever lands last, the
    file is pi-materia's text with exactly one of the two names, never a mix or a torn file."""
    project = project_with(tmp_path, "default.json")
    target = project / ".pi" / "pi-materia.json"
    original = target.read_text(encoding="utf-8")
    procs = [subprocess.Popen([sys.executable, "-m", "castor", "loadout", name], cwd=project, env=_env(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("Planning-Consult", "Hojo-Consult")]
    for proc in procs:
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
    final = target.read_text(encoding="utf-8")
    assert final in {original.replace('"activeLoadout": "Full-Auto"', f'"activeLoadout": "{name}"', 1)
                     for name in ("Planning-Consult", "Hojo-Consult")}
    assert [p.name for p in target.parent.iterdir()] == ["pi-materia.json"]  # no temp file left behind


# --------------------------------------------------------------------------- the graph's documented semantics


def _verdict(satisfied: bool, feedback: str = "") -> str:
    return json.dumps({"summary": "checked", "satisfied": satisfied, "feedback": feedback, "missing": []})


TWO_ITEMS = [{**WORK_ITEM, "id": "alpha"}, {**WORK_ITEM, "id": "beta", "title": "Beta"}]


@pytest.mark.timeout(240)
def test_the_graph_semantics_example_retries_rejections_per_item_and_ends_at_the_last_items_exit(
    tmp_path: Path,
) -> None:
    """pi-materia's graph-semantics example, as it documents its graph: an evaluator's rejection
    sends the item back to Build, Maintain's own rejection retries Maintain, Maintain's
    satisfaction advances to the next work item, and after the last one the loop's exit ends
    the cast; each verdict's feedback is assigned where the socket's ``assign`` says."""
    fixture, loadout = "graph-semantics-loadout.json", "Graph Semantics Example"
    project = project_with(tmp_path, fixture)
    script = script_for(fixture, loadout, work_items=TWO_ITEMS)
    script["Socket-5"] = [_verdict(False, "alpha is not done"), _verdict(True), _verdict(True, "beta ok")]
    script["Socket-6"] = [_verdict(True), _verdict(False), _verdict(True)]
    result, run_dir = run_cast(tmp_path, project, loadout, script)
    assert result.returncode == 0, result.stderr
    assert started(run_dir) == ["Socket-1", "Socket-2", "Socket-3",
                                "Socket-4", "Socket-5", "Socket-4", "Socket-5", "Socket-6",  # alpha: one rejection
                                "Socket-4", "Socket-5", "Socket-6", "Socket-6"]  # beta: Maintain retries itself
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert state["phase"] == "complete" and state["cursors"]["workItemIndex"] == 2
    assert state["data"]["lastFeedback"] == "beta ok" and state["data"]["lastCheck"]["satisfied"] is True
    assert [item["id"] for item in state["data"]["workItems"]] == ["alpha", "beta"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("fixture", "loadout"), [("graph-semantics-loadout.json", "Graph Semantics Example"),
                                                  ("default.json", "Full-Auto")])
def test_the_fourth_rejection_across_all_items_fails_the_cast_at_the_edges_limit(
    tmp_path: Path, fixture: str, loadout: str
) -> None:
    """The evaluator's rejection edge allows 3 traversals for the whole cast, not per item: two
    rejections of the first item and two of the second fail the cast at the fourth, naming the
    edge and its count."""
    project = project_with(tmp_path, fixture)
    script = script_for(fixture, loadout, work_items=TWO_ITEMS)
    no, yes = _verdict(False, "not yet"), _verdict(True)
    script["Socket-5"] = [no, no, yes, no, no, yes]
    script["Socket-6"] = [yes, yes]
    result, run_dir = run_cast(tmp_path, project, loadout, script)
    assert result.returncode == 1, result.stdout
    assert "edge traversal limit exceeded for Socket-5->Socket-4 (4/3)" in result.stderr, result.stderr
    assert started(run_dir).count("Socket-5") == 5 and started(run_dir).count("Socket-6") == 1  # visit 5 is rejection 4
    assert events(run_dir)[-1]["type"] == "cast_end" and events(run_dir)[-1]["data"]["ok"] is False
