"""castor.adapters.materia.cast_lease: one live holder per cast, dropped by the kernel on death."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from castor.adapters.materia.cast_lease import LEASE_FILE, CastLease

CAST = "2026-01-01T00-00-00-000Z"


def test_one_holder_at_a_time_and_the_probe_sees_it(tmp_path):
    first = CastLease.try_acquire(tmp_path, CAST)
    assert first is not None and CastLease.try_acquire(tmp_path, CAST) is None
    assert CastLease.is_held(tmp_path, CAST)
    first.release()
    first.release()  # idempotent
    assert not CastLease.is_held(tmp_path, CAST)
    again = CastLease.try_acquire(tmp_path, CAST)
    assert again is not None
    again.release()


def test_the_probe_creates_nothing_and_needs_no_write_access(tmp_path):
    assert not CastLease.is_held(tmp_path, CAST)
    assert not (tmp_path / CAST).exists()  # a read never makes a run dir or a lock file
    CastLease.try_acquire(tmp_path, CAST).release()
    (tmp_path / CAST / LEASE_FILE).chmod(0o444)
    assert not CastLease.is_held(tmp_path, CAST)


@pytest.mark.timeout(30)
def test_a_holder_killed_with_sigkill_leaves_the_lease_free(tmp_path):
    code = ("import sys, time; from castor.adapters.materia.cast_lease import CastLease; "
            f"lease = CastLease.try_acquire(sys.argv[1], {CAST!r}); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert CastLease.is_held(tmp_path, CAST)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    assert not CastLease.is_held(tmp_path, CAST)
