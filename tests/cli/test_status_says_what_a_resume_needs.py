"""``castor status`` of a resumable cast says what the resume it names needs first: a run directory
no command can write now (a read-only mount, a permission taken away), or an agent the CLI does not
know. It used to name the recast as if it would run, and that recast then failed at once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.cli.interrupted_cast import castor_cli, interrupted_cast


def test_status_of_a_cast_on_a_read_only_mount_says_it_cannot_be_resumed_until_writable(tmp_path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a tmpfs mount needs root")
    fs = tmp_path / "fs"
    fs.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(fs)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        project, run = interrupted_cast(fs)
        before = json.loads(castor_cli(tmp_path, "status", run.name, "--json", cwd=project).stdout)
        assert before["resumable"] is True and "not_writable" not in before
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True, capture_output=True)
        shown = castor_cli(tmp_path, "status", run.name, cwd=project)
        assert shown.returncode == 0, shown.stderr
        assert (f"cannot be resumed now: .pi/pi-materia/{run.name} cannot be written (EROFS); make it writable"
                in shown.stdout), shown.stdout
        as_json = json.loads(castor_cli(tmp_path, "status", run.name, "--json", cwd=project).stdout)
        assert as_json["not_writable"] == {"errno": "EROFS", "path": f".pi/pi-materia/{run.name}"}
        recast = castor_cli(tmp_path, "recast", run.name, "--agent", "script:answers.json", "--quiet", cwd=project)
        assert recast.returncode == 1 and "EROFS" in recast.stderr  # what status said would happen
    finally:
        subprocess.run(["umount", "-l", str(fs)], capture_output=True)


def test_status_of_a_cast_this_user_may_not_write_says_eacces(tmp_path, monkeypatch, capsys):
    from castor.cli.app import main

    project, run = interrupted_cast(tmp_path)
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False if str(path) == str(run) and mode == os.W_OK
                        else real(path, mode, *a, **k))
    monkeypatch.chdir(project)
    assert main(["status", run.name]) == 0
    out = capsys.readouterr().out
    assert f".pi/pi-materia/{run.name} cannot be written (EACCES)" in out, out


def test_status_of_a_cast_with_no_agent_remembered_says_the_resume_needs_one(tmp_path):
    """A cast a harness ran (or an ``openai:`` one) has no agent the CLI may take: the ``castor
    recast`` or ``continue`` status named stopped at once on ``invalid_params: no agent``."""
    project, run = interrupted_cast(tmp_path)
    remembered = castor_cli(tmp_path, "status", run.name, cwd=project)
    assert "no agent is remembered" not in remembered.stdout, remembered.stdout  # cli.json names its script
    (run / "cli.json").unlink()
    shown = castor_cli(tmp_path, "status", run.name, cwd=project)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.rstrip().endswith("no agent is remembered for it: a recast or continue here needs --agent "
                                          "script:FILE or --agent openai:BASE_URL[#MODEL] (or CASTOR_AGENT); or "
                                          "resume it in a harness session (/materia recast)"), shown.stdout
    assert json.loads(castor_cli(tmp_path, "status", run.name, "--json", cwd=project).stdout)["needs_agent"] is True
    resumed = castor_cli(tmp_path, "continue", run.name, cwd=project)
    assert resumed.returncode != 0 and "no agent" in resumed.stderr  # what status said


def test_every_other_line_naming_the_recast_of_a_cast_with_no_agent_remembered_says_what_it_needs(tmp_path):
    """``castor status`` and ``castor abort`` said what the recast they name needs for a cast a
    harness ran; ``castor casts``' ``↻ RECAST TARGET`` line and ``castor continue``'s refusal of such
    a cast (ended, so "`castor recast ID` resumes it") named the recast alone, which stopped at once
    on ``no agent``. Each says it now, as status does."""
    project, run = interrupted_cast(tmp_path)
    (run / "cli.json").unlink()  # as a cast a harness ran: no agent for the CLI
    aborted = castor_cli(tmp_path, "abort", run.name, cwd=project)
    assert aborted.returncode == 0 and NO_AGENT in aborted.stdout, aborted.stdout + aborted.stderr
    listed = castor_cli(tmp_path, "casts", cwd=project)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    target = next(i for i, line in enumerate(lines) if f"RECAST TARGET — recast: castor recast {run.name}" in line)
    assert lines[target + 1] == f"    ! {NO_AGENT}", listed.stdout
    rows = json.loads(castor_cli(tmp_path, "casts", "--json", cwd=project).stdout)
    assert [row["needs_agent"] for row in rows if row["cast_id"] == run.name] == [True], rows
    refused = castor_cli(tmp_path, "continue", run.name, cwd=project)
    assert refused.returncode != 0, refused.stdout
    assert f"`castor recast {run.name}` resumes it; {NO_AGENT}." in refused.stderr, refused.stderr


NO_AGENT = ("no agent is remembered for it: a recast or continue here needs --agent script:FILE or --agent "
            "openai:BASE_URL[#MODEL] (or CASTOR_AGENT); or resume it in a harness session (/materia recast)")
