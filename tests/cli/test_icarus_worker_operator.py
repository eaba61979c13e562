"""The operator's view of an Icarus worker that dies in every call, from the outside: a real
``castor --log-json serve`` with its console, a harness on its socket, ``castor inspect`` and
``/metrics`` as an operator runs them. The package is the TEST FAKE
``tests/support/icarus_packages/dies_in_every_call`` (``os._exit(3)`` in every hook)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from castor.client import Client
from tests.support.served import CASTOR, metrics_reader, served_env, start_serve

pytestmark = pytest.mark.timeout(90)

DYING = Path(__file__).resolve().parents[1] / "support" / "icarus_packages" / "dies_in_every_call" / "icarus"


def _env(tmp_path: Path) -> dict[str, str]:
    return served_env(tmp_path, DYING)


def test_a_given_up_worker_is_one_warning_and_shows_in_inspect_the_tree_and_metrics(tmp_path):
    env = _env(tmp_path)
    served = start_serve(tmp_path, env, "--console", "127.0.0.1:0", "--icarus-worker-max-deaths", "2",
                         "--icarus-worker-cool-down", "600", log_json=True)
    server, sock, log, project = served.process, served.socket, served.log, served.project
    try:
        metrics_of = metrics_reader(log)
        with Client.connect_unix(str(sock)) as client:
            client.call("session.open", {"session_id": "s1", "cwd": str(project)}, timeout=20)
            for n in range(6):  # two deaths, then four hooks refused at once
                assert client.call("harness.event", {"session_id": "s1", "event": "before_agent_start",
                                                     "data": {"prompt": f"PROMPT-{n}", "message_type": "user"}},
                                   timeout=30) == {}

            def inspect(*args: str) -> str:
                shown = subprocess.run([*CASTOR, "inspect", "--socket", str(sock), *args], env=env,
                                       capture_output=True, text=True, timeout=30)
                assert shown.returncode == 0, shown.stderr
                return shown.stdout

            worker = inspect("worker", "--session-id", "s1")
            row = next(line for line in worker.splitlines() if "crash loop" in line)
            assert "given up (2 deaths within 60 s, last: exit code 3)" in row and "4 refused" in row
            assert re.search(r"workers started\s*│?\s*2\b", worker), worker
            tree = inspect("actors")
            assert "IcarusWorkerActor" in tree and "worker given up: it died 2 times within 60 s" in tree
            metrics = metrics_of()
            assert "castor_worker_give_ups_total 1.0" in metrics
            assert "castor_worker_calls_refused_total 4.0" in metrics
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    given_up = [r for r in records if "icarus worker given up" in r["record"]["message"]]
    assert len(given_up) == 1 and given_up[0]["record"]["level"]["name"] == "WARNING"
    assert given_up[0]["record"]["extra"]["max_deaths"] == 2
    # a refused hook is no warning of its own: warnings about this worker stop at the give-up
    worker_warnings = [r for r in records if r["record"]["level"]["name"] == "WARNING"
                       and "/icarus/" in str(r["record"]["extra"].get("actor", ""))]
    assert len(worker_warnings) <= 6, [r["record"]["message"] for r in worker_warnings]
    assert "PROMPT-" not in log.read_text()


@pytest.mark.parametrize(("flag", "value"), [("--icarus-worker-max-deaths", "0"), ("--icarus-worker-max-deaths", "x"),
                                             ("--icarus-worker-death-window", "0"),
                                             ("--icarus-worker-cool-down", "nan"),
                                             ("--icarus-worker-cool-down", "86401")])
def test_a_crash_loop_limit_that_could_not_work_is_a_usage_error_naming_the_flag(tmp_path, flag, value):
    done = subprocess.run([*CASTOR, "serve", "--socket", str(tmp_path / "s.sock"), flag, value],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=30, cwd=str(tmp_path))
    assert done.returncode == 2
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith(f"castor: invalid_params: argument {flag}: ")
    assert not (tmp_path / "s.sock").exists()  # refused before anything listens
