"""`castor soak` on a disk that fills up: it reports, it does not sit out its waits.

A cast stopped by a full disk is resumable, and its recast is refused ``storage_unavailable``
while the disk stays full; the soak then waited the whole quiescence bound (75 s) three times
for casts no recast had started -- a 5 s soak on a full tmpfs ran past 3 minutes.
"""

from __future__ import annotations

import errno
import os
import time

import pytest

from castor.adapters import fs
from castor.testing.soak import SoakSettings, run_soak


@pytest.mark.timeout(100)
def test_a_soak_whose_disk_fills_ends_promptly_and_says_why_its_casts_were_not_recast(tmp_path, monkeypatch):
    real = fs._write_all
    root = str(tmp_path.resolve() / "projects")
    writes = {"n": 0}

    def write_all(fd: int, data: bytes) -> None:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.startswith(root):
            writes["n"] += 1
            if writes["n"] > 12:  # the first cast started and saved a few transitions: now the disk is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(fs, "_write_all", write_all)
    settings = SoakSettings(sessions=1, casts=2, seconds=3, seed=3, concurrency=1, delay_ms_max=200,
                            fault_interval_s=(5.0, 6.0), icarus=False, workdir=str(tmp_path))
    started = time.monotonic()
    report = run_soak(settings)
    elapsed = time.monotonic() - started
    assert report.casts_started >= 1, report.model_dump_json(indent=1)
    assert not report.ok and report.must_be_zero.casts_not_terminal_after_recast >= 1, report.model_dump_json(indent=1)
    assert elapsed < 45, f"the soak sat out its waits: {elapsed:.0f} s"
    assert any("storage_unavailable" in note for note in report.notes), report.notes


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs filled to the last block (mounted by the test: root only, skipped otherwise)."""
    from tests.support.tmpfs import fill_to_the_last_block, mounted_tmpfs

    with mounted_tmpfs(tmp_path / "disk", "64k") as disk:
        fill_to_the_last_block(disk)
        yield disk


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", [["demo", "--quiet"], ["soak", "--seconds", "5"]])
def test_the_demo_and_the_soak_in_a_full_directory_name_the_file_the_disk_refused(full_disk, tmp_path, command):
    """`castor demo` / `castor soak` run in a full directory said ``storage_unavailable: No space left on
    device (ENOSPC)`` and named no file: their scaffolding (a project's config, the Icarus settings)
    was written with ``Path.write_text``, whose error at close carries no name. It names the file."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "castor", *command], cwd=full_disk, capture_output=True, text=True,
                          timeout=100, env={**os.environ, "PYTHONPATH": str(repo), "HOME": str(tmp_path / "home")})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    said = [line for line in (done.stdout + done.stderr).splitlines() if "storage_unavailable" in line]
    assert said, done.stdout + done.stderr
    for line in said:
        assert ".json: No space left on device (ENOSPC)" in line, said
