"""The casts section of ``castor demo``: run for real on a tmp dir, every check must pass.

Real runtime, real files, real utility subprocesses; only the model is a stand-in (the
scripted agent).
"""

from __future__ import annotations

import json
import time

import pytest
from rich.console import Console

from castor.demo import DemoReport
from castor.demo_casts import CASTS_PER_SESSION, ITEMS, SESSIONS, section_casts


@pytest.mark.timeout(40)
def test_the_casts_section_passes_every_check_quickly(tmp_path):
    report = DemoReport(Console(quiet=True))
    started = time.monotonic()
    section_casts(report, tmp_path)
    elapsed = time.monotonic() - started
    failed = [(c.name, c.detail) for c in report.checks if not c.ok]
    assert failed == []
    assert len(report.checks) == 7 and all(c.section == "casts" for c in report.checks)
    names = " | ".join(c.name for c in report.checks)
    for must in ("concurrently", "killed SocketActor", "every cast ended complete", "events.jsonl",
                 "rework", "real command", "state.json"):
        assert must in names
    assert elapsed < 25
    # The evidence is on disk where the section put it.
    base = tmp_path / "casts"
    visits = (base / "utility-visits.log").read_text().split()
    assert len(visits) == len(set(visits)) == len(SESSIONS) * CASTS_PER_SESSION * ITEMS
    run_dirs = [d for sid in SESSIONS for d in (base / sid / ".pi" / "pi-materia").iterdir() if d.is_dir()]
    assert len(run_dirs) == len(SESSIONS) * CASTS_PER_SESSION
    recast = [d for d in run_dirs
              if any(json.loads(line)["type"] == "cast_recast" for line in (d / "events.jsonl").read_text().splitlines())]
    assert len(recast) == 1  # exactly the cast whose SocketActor was killed
    for d in run_dirs:
        assert json.loads((d / "state.json").read_text())["state"]["phase"] == "complete"
