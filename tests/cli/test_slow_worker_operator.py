"""The operator's view of an Icarus worker call that hangs, from the outside: a real
``castor --log-json serve`` with its console, a harness on its socket whose prompt hook hangs in the
worker and whose Fabric tool calls queue behind it, and ``castor inspect`` and ``/metrics`` as an
operator runs them. The package is the TEST FAKE ``tests/support/icarus_packages/slow_hooks``
(``pre_llm_call`` sleeps past its deadline)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from castor.client import Client
from tests.support.served import CASTOR, metrics_reader, served_env, start_serve
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)

SLOW = Path(__file__).resolve().parents[1] / "support" / "icarus_packages" / "slow_hooks" / "icarus"


def _env(tmp_path: Path) -> dict[str, str]:
    return served_env(tmp_path, SLOW, ICARUS_FAKE_SLOW_S="600")


def _row(table: str, name: str) -> str:
    """The value cell of the row ``name`` of a two-column table printed to a pipe (one line a row)."""
    match = re.search(rf"^[│|]\s*{re.escape(name)}\s*[│|]\s*(.*?)\s*[│|]\s*$", table, re.MULTILINE)
    assert match, f"no row {name!r} in:\n{table}"
    return match.group(1)


def test_a_hanging_worker_call_shows_what_it_does_its_deadline_and_the_calls_queued_behind_it(tmp_path):
    env = _env(tmp_path)
    served = start_serve(tmp_path, env, "--console", "127.0.0.1:0", log_json=True)
    server, sock, log, project = served.process, served.socket, served.log, served.project
    client = None
    try:
        metrics_of = metrics_reader(log)
        client = Client.connect_unix(str(sock))
        client.call("session.open", {"session_id": "s1", "cwd": str(project)}, timeout=20)

        def call(method: str, params: dict) -> None:
            try:
                client.call(method, params, timeout=60)
            except Exception:  # noqa: BLE001 - a call cut short by the serve's end is no finding here
                pass

        calls = [threading.Thread(target=call, daemon=True, args=("harness.event", {
            "session_id": "s1", "event": "before_agent_start",
            "data": {"prompt": "PROMPT-TEXT-NEVER-SHOWN", "message_type": "user"}}))]
        calls += [threading.Thread(target=call, daemon=True, args=("icarus.tool", {
            "session_id": "s1", "name": "fabric_search", "params": {"query": f"QUERY-TEXT-NEVER-SHOWN-{n}"}}))
            for n in range(2)]
        calls[0].start()

        def inspect(*args: str) -> str:
            shown = subprocess.run([*CASTOR, "inspect", "--socket", str(sock), *args], env=env,
                                   capture_output=True, text=True, timeout=30)
            assert shown.returncode == 0, shown.stderr
            return shown.stdout

        wait_for(lambda: "worker call hooks.pre_llm_call" in inspect("actors", "--prefix", "/root/session/s1/icarus"),
                 30, "the hanging hook's worker call")
        for thread in calls[1:]:
            thread.start()
        worker = wait_for(lambda: (out := inspect("worker", "--session-id", "s1")) and "queued calls" in out
                          and _row(out, "mailbox depth") == "2" and out, 30, "the two queued tool calls")
        doing = _row(worker, "doing now")
        # what it does, for how long and what ends it -- not the tree's whole line again
        assert re.fullmatch(r"worker call hooks\.pre_llm_call for \d+\.\ds, deadline in \d+\.\ds", doing), doing
        assert _row(worker, "queued calls").count("tools.fabric_search") == 2
        metrics = metrics_of()
        assert 'castor_mailbox_depth{kind="IcarusWorkerActor"} 2.0' in metrics
        tree = inspect("actors")
        for seen in (worker, tree, metrics):
            assert "NEVER-SHOWN" not in seen
    finally:
        if client is not None:
            client.close()
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    assert "NEVER-SHOWN" not in log.read_text()


def test_hook_calls_queued_behind_a_hanging_one_are_counted_not_repeated(tmp_path):
    """Three prompts of one session while the first one's retrieval hangs: the hook controller's
    line says what runs and how many worker calls wait behind it (the hook lane's queue is no
    mailbox: the worker's depth stays 0), rather than the same words three times over."""
    env = _env(tmp_path)
    served = start_serve(tmp_path, env)
    server, sock, project = served.process, served.socket, served.project
    client = None
    try:
        wait_for(sock.exists, 30, "the socket")
        client = Client.connect_unix(str(sock))
        client.call("session.open", {"session_id": "s1", "cwd": str(project)}, timeout=20)

        def prompt(n: int) -> None:
            try:
                client.call("harness.event", {"session_id": "s1", "event": "before_agent_start",
                                              "data": {"prompt": f"PROMPT-{n}-NEVER-SHOWN", "message_type": "user"}},
                            timeout=60)
            except Exception:  # noqa: BLE001 - a call cut short by the serve's end is no finding here
                pass

        for n in range(3):
            threading.Thread(target=prompt, args=(n,), daemon=True).start()

        def hooks_line() -> str:
            shown = subprocess.run([*CASTOR, "inspect", "--socket", str(sock), "actors", "--prefix",
                                    "/root/session/s1/icarus"], env=env, capture_output=True, text=True, timeout=30)
            assert shown.returncode == 0, shown.stderr
            return next((line for line in shown.stdout.splitlines() if "HookController" in line), "")

        line = wait_for(lambda: (found := hooks_line()) and "2 queued" in found and found, 30,
                        "the two prompts queued behind the hanging one")
        assert line.count("retrieving memories") == 1, line
        assert "for 3 prompts" in line and "NEVER-SHOWN" not in line
    finally:
        if client is not None:
            client.close()
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def test_a_serve_whose_session_is_slow_to_close_says_what_its_stop_waits_on(tmp_path):
    """SIGTERM while a session's Icarus end hangs: the socket is gone at once (``castor inspect``
    finds no castor), and the stop takes the end's deadline; the log says, within seconds, which
    session it is closing and what that waits on, rather than nothing until the end."""
    env = _env(tmp_path)
    env["ICARUS_FAKE_SLOW_END_S"] = "600"
    project = tmp_path / "project"
    project.mkdir()
    sock = tmp_path / "castor.sock"
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        server = subprocess.Popen([*CASTOR, "--log-json", "serve", "--socket", str(sock)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_for(sock.exists, 30, "the socket")
        with Client.connect_unix(str(sock)) as client:
            client.call("session.open", {"session_id": "s1", "cwd": str(project)}, timeout=20)
            client.call("icarus.tool", {"session_id": "s1", "name": "fabric_search", "params": {"query": "q"}},
                        timeout=30)  # the worker runs: the session's end is a worker call
            server.send_signal(signal.SIGTERM)

            def said() -> dict | None:
                for line in log.read_text().splitlines():
                    record = json.loads(line)["record"] if line.startswith("{") else None
                    if record and "still closing session s1" in record["message"]:
                        return record
                return None

            record = wait_for(said, 15, "the line saying what the stop waits on")
            assert server.poll() is None  # said while it waits, not after
            shown = subprocess.run([*CASTOR, "inspect", "--socket", str(sock)], env=env, capture_output=True,
                                   text=True, timeout=30)
            assert server.poll() is None
            # its socket file is still there, nothing accepts on it: a castor stopping (or one killed)
            assert shown.returncode == 1 and "stopping" in shown.stderr, shown.stderr
            assert "the log says what it waits on" in shown.stderr
        assert record["level"]["name"] == "WARNING"
        assert "worker call hooks.on_session_end" in record["message"], record["message"]
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        server.wait(60)
