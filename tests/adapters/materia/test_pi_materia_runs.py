"""Run directories pi-materia itself wrote (events.jsonl, no state.json): listed as pi-materia's
own ``casts`` lists them when the session's state is not at hand -- status from the events, the
latest socket, the request -- and named, not "no state.json", by every verb that cannot use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from castor.adapters.materia import pi_materia_runs
from castor.adapters.materia.state_store import list_page

REPO = Path(__file__).resolve().parents[3]


def _run(root: Path, cast_id: str, *events: tuple[str, dict]) -> Path:
    run_dir = root / cast_id
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_text(
        "".join(json.dumps({"ts": i, "type": t, "data": d}) + "\n" for i, (t, d) in enumerate(events)))
    return run_dir


START = ("cast_start", {"request": "build the thing", "pipeline": {"entry": "Socket-1"}})


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("end", "outcome", "error"), [
    (("cast_end", {"ok": True, "usage": {}}), "complete", None),
    (("cast_end", {"ok": False, "error": "Invalid JSON output"}), "failed", "Invalid JSON output"),
    (("cast_end", {"ok": False, "error": "Cast aborted by user"}), "aborted", "Cast aborted by user"),
    (None, "active or unknown", None),
])
def test_the_status_comes_from_the_events(tmp_path, end, outcome, error):
    events = [START, ("socket_start", {"socket": "Socket-1"}), ("socket_complete", {"socket": "Socket-2"})]
    run = pi_materia_runs.describe(str(_run(tmp_path, "c", *events, *([end] if end else []))))
    assert run == pi_materia_runs.PiMateriaRun(outcome=outcome, socket="Socket-2", request="build the thing",
                                               error=error)


@pytest.mark.timeout(30)
def test_a_huge_log_is_read_at_its_two_ends_only(tmp_path):
    run_dir = _run(tmp_path, "c", START)
    with open(run_dir / "events.jsonl", "a") as log:
        line = json.dumps({"ts": 1, "type": "utility_command", "data": {"pad": "x" * 1000}}) + "\n"
        log.write(line * 20_000)  # 20 MB
        log.write("not json\n" + json.dumps({"ts": 2, "type": "materia_model_settings", "data": {"socket": "S-9"}})
                  + "\n" + json.dumps({"ts": 3, "type": "cast_end", "data": {"ok": True}}) + "\n")
    run = pi_materia_runs.describe(str(run_dir))
    assert (run.outcome, run.socket, run.request) == ("complete", "S-9", "build the thing")


@pytest.mark.timeout(30)
def test_what_is_not_an_events_file_describes_nothing(tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps({"ts": 1, "type": "cast_end", "data": {"ok": True}}) + "\n")
    for name, make in (("link", lambda p: p.symlink_to(outside)), ("fifo", os.mkfifo),
                       ("dir", Path.mkdir), ("garbage", lambda p: p.write_bytes(b"\x00\xff{[\n" * 10)),
                       ("empty", lambda p: p.write_text(""))):
        (tmp_path / name).mkdir()
        make(tmp_path / name / "events.jsonl")
        assert pi_materia_runs.describe(str(tmp_path / name)) is None, name
    assert pi_materia_runs.describe(str(tmp_path / "absent")) is None
    castors = _run(tmp_path, "castors", START)  # castor's own run whose state.json went missing
    (castors / "owner.lock").write_text("")
    assert pi_materia_runs.describe(str(castors)) is None


@pytest.mark.timeout(30)
def test_the_listing_says_whose_run_it_is_and_a_later_event_is_seen(tmp_path):
    root = tmp_path / "root"
    run_dir = _run(root, "2026-01-02T03-04-05-006Z", START, ("socket_start", {"socket": "Socket-1"}))
    _run(root, "2026-01-03T03-04-05-006Z")  # an empty log: a directory castor cannot read
    (root / "2026-01-03T03-04-05-006Z" / "events.jsonl").write_text("")
    page = list_page(root)
    pi, other = sorted(page.problems, key=lambda p: p.cast_id)
    assert (pi.current_socket, pi.request) == ("Socket-1", "build the thing")
    assert pi.reason == "a pi-materia run (no castor state; not resumable here): active or unknown at Socket-1"
    assert other.reason == "no state.json" and other.request is None
    with open(run_dir / "events.jsonl", "a") as log:  # pi-materia ends it meanwhile
        log.write(json.dumps({"ts": 9, "type": "cast_end", "data": {"ok": False, "error": "boom"}}) + "\n")
    pi = next(p for p in list_page(root).problems if p.cast_id == pi.cast_id)
    assert pi.reason.endswith("failed at Socket-1: boom")


@pytest.mark.timeout(60)
def test_the_cli_lists_them_on_one_line_and_names_them_when_asked_to_resume(tmp_path):
    project = tmp_path / "project"
    root = project / ".pi" / "pi-materia"
    _run(root, "2026-01-02T03-04-05-006Z", START, ("socket_start", {"socket": "Socket-2"}),
         ("cast_end", {"ok": False, "error": "Invalid JSON\nFORGED LINE"}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home"), "CASTOR_AGENT": ""}

    def castor(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "castor", *args], cwd=project, env=env, text=True,
                              capture_output=True, timeout=30)

    listing = castor("casts")
    assert listing.returncode == 0, listing.stderr
    [row] = [line for line in listing.stdout.splitlines() if "2026-01-02" in line]
    assert "a pi-materia run" in row and "failed at Socket-2: Invalid JSON\\nFORGED LINE" in row
    assert "build the thing" in row and "RECAST TARGET" not in listing.stdout
    assert not any(line.startswith("FORGED") for line in listing.stdout.splitlines())
    for verb in (("status", "2026-01-02T03-04-05-006Z"), ("recast", "2026-01-02T03-04-05-006Z")):
        result = castor(*verb, "--agent", "script:none.json") if verb[0] == "recast" else castor(*verb)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert result.stderr.startswith("castor: not_found: cast 2026-01-02T03-04-05-006Z is a pi-materia run")
