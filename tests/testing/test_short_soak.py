"""A short real soak: 2 sessions × 4 casts under random fault injection; every invariant holds.

Real runtime, real files, real utility subprocesses and real Icarus worker subprocesses
(the reference backend, a stand-in for the private plugin); only the model is scripted.
"""

from __future__ import annotations

import json

import pytest

from castor.cli import main
from castor.testing.soak import SoakSettings, run_soak


@pytest.mark.timeout(120)
def test_short_soak_injects_faults_and_every_invariant_holds(tmp_path):
    # ``seconds`` bounds the fault phase; it ends as soon as every cast has ended, so a generous
    # bound costs nothing on a quiet machine and lets a loaded one start all eight casts.
    settings = SoakSettings(sessions=2, casts=4, seconds=40, seed=11, concurrency=2, delay_ms_max=400,
                            fault_interval_s=(0.05, 0.25), workdir=str(tmp_path))
    report = run_soak(settings)
    assert report.must_be_zero.violations() == {}, report.model_dump_json(indent=1)
    assert report.ok
    assert report.casts_planned == 8 and report.casts_started == 8
    assert report.casts_completed + report.casts_failed + report.casts_aborted == 8
    # Not vacuous: faults of several kinds landed, commands ran, the worker was called and hurt.
    assert sum(report.faults.values()) >= 10 and len(report.faults) >= 4, report.faults
    assert report.utility_executions >= 8
    assert report.worker_calls.get("ok", 0) >= 20
    assert report.asks >= 50
    visits = (tmp_path / "utility-visits.log").read_text().split()
    assert len(visits) == report.utility_executions == len(set(visits))
    calls = [json.loads(line) for line in (tmp_path / "icarus" / "backend-calls.jsonl").read_text().splitlines()]
    assert sum(1 for c in calls if c["phase"] == "start" and c["call"] == "tools.fabric_write") >= 20


@pytest.mark.timeout(60)
def test_castor_soak_command_prints_json_and_exits_zero(tmp_path, capsys):
    code = main(["soak", "--sessions", "1", "--casts", "2", "--seconds", "5", "--seed", "2", "--no-icarus",
                 "--workdir", str(tmp_path), "--json"])
    out = capsys.readouterr().out
    report = json.loads(out)
    assert code == 0, out
    assert report["casts_started"] == 2 and report["must_be_zero"]["stranded_asks"] == 0
    assert report["worker_calls"] == {}  # --no-icarus: no worker in this run
    assert (tmp_path / "soak.log").exists()  # the runtime's log went to the workdir, not the terminal


@pytest.mark.timeout(90)
def test_castor_soak_without_workdir_keeps_a_named_one_and_says_where(tmp_path):
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, HOME=str(tmp_path / "home"))
    done = subprocess.run([sys.executable, "-m", "castor", "soak", "--sessions", "1", "--casts", "1", "--seconds",
                           "2", "--no-icarus"], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=80)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    first = done.stderr.splitlines()[0]
    match = re.match(r"castor soak: workdir (\S+) \(log (\S+)\)$", first)
    assert match, first
    workdir = Path(match.group(1))
    assert workdir.parent == tmp_path and workdir.name.startswith("castor-soak-") and workdir.is_dir()
    assert Path(match.group(2)).is_file()
    assert f"kept: {workdir}" in done.stdout  # whole, never wrapped
    assert "Traceback" not in done.stdout + done.stderr
    listed = re.findall(r"castor casts --cwd (\S+)", done.stdout)
    assert listed and all(Path(p).is_dir() for p in listed)
