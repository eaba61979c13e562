"""JSON that Python's reader cannot take although it is JSON: a value nested deeper than the
recursion limit (``RecursionError``) or an integer of more than 4,300 digits (a plain ``ValueError``,
not ``JSONDecodeError``). Met in a project's own files -- a damaged ``state.json``, an answers file,
a config layer -- it used to end ``castor casts`` / ``status`` / ``cast`` with a traceback, or with
``invalid_params`` quoting Python's advice to call ``sys.set_int_max_str_digits()``; one damaged cast
hid every other cast of the project from ``castor casts``. Now it is the file's own typed error and
the listing shows the damaged cast as unreadable beside the others."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli.interrupted_cast import ONE_SOCKET, castor_cli, interrupted_cast

DEEP = "[" * 100_000 + "]" * 100_000
HUGE_INT = "9" * 5000




def _one_line_error(result: subprocess.CompletedProcess[str], code: str) -> str:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and "set_int_max_str_digits" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"castor: {code}: "), result.stderr
    return line


@pytest.fixture
def two_casts(tmp_path: Path) -> tuple[Path, list[Path]]:
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(ONE_SOCKET))
    (root / "answers.json").write_text(json.dumps(["hi"]))
    for request in ("first", "second"):
        done = castor_cli(tmp_path, "cast", request, "--agent", "script:answers.json", "--quiet", cwd=root)
        assert done.returncode == 0, done.stderr
    runs = sorted(p for p in (root / ".pi" / "pi-materia").iterdir() if p.is_dir())
    assert len(runs) == 2
    return root, runs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["nested", "huge_integer"])
def test_a_state_json_python_cannot_read_lists_as_unreadable_and_hides_no_other_cast(tmp_path, two_casts, damage):
    root, (first, second) = two_casts
    text = (first / "state.json").read_text()
    if damage == "nested":
        text = text[:-1].rstrip() + f', "x": {DEEP}}}'
    else:
        text = text.replace('"revision":', f'"revision":{HUGE_INT},"was":', 1)
        assert HUGE_INT in text
    (first / "state.json").write_text(text)
    listed = castor_cli(tmp_path, "casts", "--json", cwd=root)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    rows = {row["cast_id"]: row for row in json.loads(listed.stdout)}
    assert rows[first.name]["status"] == "unreadable"
    assert rows[second.name]["status"] == "complete"
    assert "state.json is not valid JSON" in _one_line_error(castor_cli(tmp_path, "status", first.name, cwd=root),
                                                              "state_corrupt")
    _one_line_error(castor_cli(tmp_path, "recast", first.name, "--agent", "script:answers.json", cwd=root),
                    "state_corrupt")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("content", "says"), [
    (DEEP, "nested too deeply"),
    (f'[{{"text": "hi", "usage": {{"input_tokens": {HUGE_INT}}}}}]', "more than 4300 digits"),
])
def test_an_answers_file_python_cannot_read_is_invalid_config(tmp_path, content, says):
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(ONE_SOCKET))
    (root / "answers.json").write_text(content)
    line = _one_line_error(castor_cli(tmp_path, "cast", "x", "--agent", "script:answers.json", "--quiet", cwd=root),
                           "invalid_config")
    assert says in line


@pytest.mark.timeout(60)
def test_a_config_with_a_huge_integer_is_an_invalid_json_problem_naming_the_file(tmp_path):
    (tmp_path / "big.json").write_text(f'{{"limits": {{"maxVisits": {HUGE_INT}}}}}')
    done = castor_cli(tmp_path, "validate", "big.json", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "[invalid-json] malformed JSON in big.json: " in done.stdout + done.stderr  # the file named once
    assert "more than 4300 digits" in done.stdout + done.stderr
    assert "set_int_max_str_digits" not in done.stdout + done.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("line", [DEEP, f'{{"ts": 1, "type": "x", "data": {{"n": {HUGE_INT}}}}}'])
def test_an_event_line_python_cannot_read_is_skipped_and_the_cast_goes_on(tmp_path, line):
    """Every start of a persisted cast reads its ``events.jsonl`` (the outbox replay must not append
    an event twice). One such line in it -- a damaged log -- crash-looped the CastActor until its
    supervisor gave up (``actor_stopped``), so the cast could never be continued; now the line is
    skipped like any corrupt one and the cast completes."""
    root, run = interrupted_cast(tmp_path)
    with open(run / "events.jsonl", "a") as log:
        log.write(line + "\n")
    done = castor_cli(tmp_path, "continue", run.name, "--agent", "script:answers.json", "--quiet", cwd=root)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert json.loads((run / "state.json").read_text())["state"]["phase"] == "complete"


def _nested_params_config(depth: int) -> str:
    deep = "1"
    for _ in range(depth):
        deep = '{"a": ' + deep + "}"
    return ('{"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {'
            '"Socket-1": {"type": "utility", "command": ["true"], "params": ' + deep + "}}}}}")


@pytest.mark.timeout(120)
def test_a_config_nested_deeper_than_a_state_can_hold_is_refused_by_validate_and_cast(tmp_path):
    """A layer nested ~300 levels (far below the reader's own limit) validated, then every start of a
    cast crash-looped: the resolved config could not be saved in the state (``internal``, tracebacks,
    a run directory left unreadable). Now validate and cast refuse it, naming the file."""
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    (root / "answers.json").write_text("[]")
    (root / ".pi" / "pi-materia.json").write_text(_nested_params_config(300))
    checked = castor_cli(tmp_path, "validate", ".pi/pi-materia.json", cwd=root)
    assert checked.returncode == 1 and "nested too deeply" in checked.stdout + checked.stderr
    line = _one_line_error(castor_cli(tmp_path, "cast", "x", "--agent", "script:answers.json", "--quiet", cwd=root),
                           "invalid_config")
    assert "nested too deeply" in line
    assert not (root / ".pi" / "pi-materia").exists() or not any((root / ".pi" / "pi-materia").iterdir())
    (root / ".pi" / "pi-materia.json").write_text(_nested_params_config(150))  # deep, within the bound: runs
    done = castor_cli(tmp_path, "cast", "x", "--agent", "script:answers.json", "--quiet", cwd=root)
    assert done.returncode == 0, done.stderr
