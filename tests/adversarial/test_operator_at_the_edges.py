"""An operator asking a real ``castor serve`` "what is it doing" when the serve is in a corner:
every slot taken, a token file from an earlier serve. Each answer is the command's one typed line,
naming the castor asked and what to do about it."""

from __future__ import annotations

import shutil

import pytest

from castor.client import Client

from .conftest import castor, free_port

pytestmark = pytest.mark.timeout(60)


def _only_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_inspect_of_a_serve_whose_connections_are_all_taken_is_one_line_naming_the_limit(tmp_path, serve):
    """It printed two WARNING lines first (the client's "write failed: [Errno 32] Broken pipe" and
    "server reported an error: {...}") and then "castor: mailbox_full: too many connections (limit
    2)": not which castor, nor that the limit is the serve's --max-connections."""
    sock = tmp_path / "c.sock"
    serve(tmp_path, "--socket", str(sock), "--max-connections", "2")
    holders = [Client.connect_unix(str(sock), default_timeout=10) for _ in range(2)]
    try:
        for holder in holders:
            holder.call("runtime.hello", {})
        for view in (["inspect", "--socket", str(sock)], ["inspect", "--socket", str(sock), "casts", "--json"]):
            done = castor(tmp_path, *view)
            assert done.returncode == 1, done.stdout + done.stderr
            line = _only_line(done.stderr)
            assert line.startswith(f"castor: mailbox_full: the castor at unix:{sock} serves its limit of 2 "
                                   "connections"), line
            assert "--max-connections" in line and "Traceback" not in done.stderr
    finally:
        for holder in holders:
            holder.close()


def test_inspect_with_the_token_file_of_an_earlier_serve_names_the_file_and_why_it_fails(tmp_path, serve):
    """A serve writes a new token at each start and removes its file when it stops. The old file
    (kept, or copied) answered "castor: unauthenticated: runtime.hello refused: missing or wrong
    token", the removed one "token file ... does not exist": neither said a serve's token changes
    with each start, nor where the current one is written."""
    port = free_port()
    first = serve(tmp_path, "--tcp", f"127.0.0.1:{port}")
    assert first.token_file is not None
    kept = tmp_path / "kept.token"
    shutil.copy(first.token_file, kept)
    kept.chmod(0o600)
    first.stop()
    second = serve(tmp_path, "--tcp", f"127.0.0.1:{port}")
    assert second.token_file is not None and second.token_file != first.token_file

    refused = castor(tmp_path, "inspect", "--tcp", f"127.0.0.1:{port}", "--token-file", str(kept))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    line = _only_line(refused.stderr)
    assert line.startswith(f"castor: unauthenticated: the castor at tcp:127.0.0.1:{port} refused the token in "
                           f"{kept}"), line
    assert "each castor serve writes a new token" in line and "listening on" in line, line

    gone = castor(tmp_path, "inspect", "--tcp", f"127.0.0.1:{port}", "--token-file", str(first.token_file))
    assert gone.returncode == 2, gone.stdout + gone.stderr
    line = _only_line(gone.stderr)
    assert line.startswith(f"castor: invalid_config: token file {first.token_file} does not exist"), line
    assert "removes its token file when it stops" in line, line



def test_status_and_abort_of_a_cast_whose_serve_is_stopped_say_so_and_how_to_resume_it(tmp_path, serve):
    """A serve stopped by SIGSTOP (Ctrl-Z, a debugger) holds its casts and runs nothing. `castor
    status` said the cast "runs in another castor runtime, pid N" and what it awaited, as if all
    were well; `castor abort` waited 5 s and blamed "an older castor, or one stalled", naming no
    process. Both now say the process is stopped and that `kill -CONT PID` resumes it; the abort
    at once, leaving no request behind that the serve would apply once resumed."""
    import os
    import signal

    from .conftest import a_served_cast_awaiting_its_turn

    served, client, project, cast_id = a_served_cast_awaiting_its_turn(tmp_path, serve)
    try:
        pid = served.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            status = castor(tmp_path, "status", cast_id, "--cwd", str(project))
            assert status.returncode == 0, status.stderr
            first = status.stdout.splitlines()[0]
            assert f"pid {pid}" in first and "which is stopped" in first and f"kill -CONT {pid}" in first, first
            aborted = castor(tmp_path, "abort", cast_id, "--cwd", str(project), timeout=4)
            assert aborted.returncode == 1, aborted.stdout + aborted.stderr
            line = _only_line(aborted.stderr)
            said = f"castor: conflict: pi-materia cast {cast_id} runs in castor runtime pid {pid}"
            assert line.startswith(said), line
            assert "which is stopped" in line and f"kill -CONT {pid}" in line, line
        finally:
            os.kill(pid, signal.SIGCONT)
        view = client.call("cast.status", {"session_id": "s1", "cast_id": cast_id})
        assert view["status"] == "active" and view["live"], view  # no abort left to apply once resumed
    finally:
        client.close()


def test_inspect_of_a_stopped_serve_says_at_once_that_it_is_stopped_and_how_to_resume_it(tmp_path, serve):
    """The kernel accepts connections for a stopped serve: `castor inspect` waited 10 s and said
    "did not answer ops.actors within 10 s", naming no process and no cause."""
    import os
    import signal
    import time

    sock = tmp_path / "c.sock"
    served = serve(tmp_path, "--socket", str(sock))
    pid = served.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        done = castor(tmp_path, "inspect", "--socket", str(sock), "casts")
        took = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert done.returncode == 1, done.stdout + done.stderr
    line = _only_line(done.stderr)
    assert line == (f"castor: timeout: the castor at unix:{sock} (pid {pid}) cannot answer: its process is stopped "
                    f"(SIGSTOP or Ctrl-Z): it runs nothing until `kill -CONT {pid}`"), line
    assert took < 8, took  # not the call's 10 s
    assert castor(tmp_path, "inspect", "--socket", str(sock), "casts").returncode == 0  # resumed, it answers


def test_metrics_say_how_long_a_stuck_cast_has_waited_so_an_alert_can_fire(tmp_path, serve):
    """/metrics had no figure that grows while a cast waits: an agent turn never reported, a
    command that never ends. ``castor_mailbox_oldest_age_seconds`` counts queued messages (none
    here) and ``castor_casts`` only says a cast runs, so no alert could say "stuck for an hour".
    ``castor_activity_age_seconds{kind}`` is the age of the longest current activity of each kind."""
    import re
    import time

    from tests.support.served import metrics_reader, start_a_cast_awaiting_its_turn
    from tests.support.waiting import wait_for

    sock = tmp_path / "c.sock"
    project = tmp_path / "project"
    project.mkdir()
    served = serve(tmp_path, "--socket", str(sock), "--console", "127.0.0.1:0")
    metrics = metrics_reader(served.stderr_path)
    client = Client.connect_unix(str(sock), default_timeout=20)
    try:
        start_a_cast_awaiting_its_turn(client, project)  # its turn is never reported
        started = time.monotonic()
        text = metrics()
        assert "# TYPE castor_activity_age_seconds gauge" in text, text[:3000]

        def cast_age(text: str) -> float:
            found = re.search(r'^castor_activity_age_seconds\{kind="CastActor"\} ([0-9.e+]+)$', text, re.M)
            assert found, text
            return float(found.group(1))

        def grown() -> str | None:
            now = metrics()
            return now if cast_age(now) >= 1.0 else None

        text = wait_for(grown, timeout=10, what="the cast's wait to grow")
        assert cast_age(text) <= time.monotonic() - started + 5  # the wait's age, not another clock's
    finally:
        client.close()
    idle = re.search(r'^castor_activity_age_seconds\{kind="UtilityExecutorActor"\} ([0-9.e+]+)$', text, re.M)
    assert idle and float(idle.group(1)) == 0.0, text  # an idle kind waits on nothing
