"""A ``state.json`` of any size: a large real one (20 MB) is read as any other; one past castor's
bound -- a sparse file of many gigabytes a checkout ships, which costs its disk nothing -- is
``state_corrupt`` and an unreadable row, never read into memory.

The listing, ``castor status`` and ``castor continue`` used to read the whole file: under the
address-space limit these tests set, a ``MemoryError`` traceback; without one, the file's size in
memory (the kernel's OOM killer for a large enough file)."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from castor.adapters.materia import state_store
from tests.cli.interrupted_cast import REPO, castor_cli, interrupted_cast

#: The address space each castor command may use here: far more than it needs, far less than the
#: planted file, so reading it fails at once instead of filling the machine's memory.
_ADDRESS_SPACE = 3 * 1024 ** 3


def _bounded(tmp_path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``castor ARGS`` as :func:`castor_cli` runs it, under :data:`_ADDRESS_SPACE`."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))

    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=60, preexec_fn=limit)


@pytest.mark.timeout(120)
def test_a_sparse_state_json_of_many_gigabytes_is_refused_unread(tmp_path):
    root, run = interrupted_cast(tmp_path)
    state = run / "state.json"
    state.unlink()
    with open(state, "wb") as planted:
        planted.truncate(64 * 1024 ** 3)  # 64 GiB of nothing: no disk, all address space
    listed = _bounded(tmp_path, "casts", "--json", cwd=root)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["cast_id"] == run.name and row["status"] == "unreadable", row
    assert "larger than" in row["failed_reason"], row
    for verb in (("status", run.name), ("continue", run.name, "--agent", "script:answers.json", "--quiet")):
        done = _bounded(tmp_path, *verb, cwd=root)
        assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr, done.stderr
        assert done.returncode == 1, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("castor: state_corrupt: ") and "larger than" in last, done.stderr


@pytest.mark.timeout(120)
def test_a_twenty_megabyte_state_is_listed_shown_and_continued(tmp_path):
    root, run = interrupted_cast(tmp_path)
    state = run / "state.json"
    document = json.loads(state.read_text())
    document["state"]["request"] = "r" * 20_000_000
    state.write_text(json.dumps(document))
    assert state.stat().st_size > 20_000_000
    listed = castor_cli(tmp_path, "casts", "--json", cwd=root)
    [row] = json.loads(listed.stdout)
    assert row["status"] == "interrupted", row
    shown = castor_cli(tmp_path, "status", run.name, cwd=root)
    assert shown.returncode == 0 and "interrupted" in shown.stdout, shown.stderr
    done = castor_cli(tmp_path, "continue", run.name, "--agent", "script:answers.json", "--quiet", cwd=root)
    assert done.returncode == 0, done.stderr
    assert json.loads(state.read_text())["state"]["request"] == "r" * 20_000_000


def test_a_state_over_the_bound_is_never_written_and_the_stored_one_stays(tmp_path, monkeypatch):
    store = state_store.CastStateStore(tmp_path)
    store.claim("c1")
    store.save("c1", {"request": "small"}, incarnation=1)
    before = (tmp_path / "c1" / "state.json").read_bytes()
    monkeypatch.setattr(state_store, "MAX_STATE_BYTES", 4096)
    with pytest.raises(OSError) as refused:
        store.save("c1", {"request": "x" * 5000}, incarnation=1)
    assert refused.value.errno == errno.EFBIG
    assert (tmp_path / "c1" / "state.json").read_bytes() == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["events.jsonl", "manifest.json"])
def test_a_sparse_run_directory_file_of_many_gigabytes_is_state_corrupt_never_read(tmp_path, name):
    """The same planted file as ``events.jsonl`` or ``manifest.json``: the recast's replay of the
    last transition read it whole (the events log: a ``MemoryError`` traceback; the manifest: the
    cast's actor crashed on every restart until its supervisor gave up, ``actor_stopped``), and
    ``castor status`` read the events log whole too."""
    root, run = interrupted_cast(tmp_path)
    planted = run / name
    planted.unlink(missing_ok=True)
    with open(planted, "wb") as sparse:
        sparse.truncate(64 * 1024 ** 3)
    shown = _bounded(tmp_path, "status", run.name, cwd=root)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    done = _bounded(tmp_path, "continue", run.name, "--agent", "script:answers.json", "--quiet", cwd=root)
    assert "Traceback" not in done.stderr and "actor_stopped" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("castor: state_corrupt: ") and name in last and "larger than" in last, done.stderr
    listed = _bounded(tmp_path, "casts", "--json", cwd=root)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["cast_id"] == run.name
