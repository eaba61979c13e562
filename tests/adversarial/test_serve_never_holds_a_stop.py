"""``castor serve`` never holds a stop: its main thread runs no actor code.

``castor demo`` and ``castor soak`` hold a stop that lands while an actor's code runs on their
main thread (an inline ask's handler, an ``on_start`` run on its starter), bounded by their
shutdown timeout. ``castor serve`` has nothing of the kind to bound: before it listens its main
thread builds the runtime and the console, while it serves it only waits (the endpoint's own
handlers take a stop and stop it on a thread of their own), and the sessions and casts are closed
by that stop's thread before the main thread's final shutdown, which finds nothing left. This
test watches a real serve through its life -- the console started, a session with a cast that
finished, a second session whose cast waits on its harness's turn when the stop comes -- with a
probe (a test-only wrapper planted by the script below, no hook of castor's) that says on stderr
whenever the main thread enters an actor's handler or start. A stop then ends it at once with
exit 0 and the probe never spoke."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from castor.client import Client
from tests.support.processes import killed_on_exit
from tests.support.waiting import wait_for

from .conftest import castor_env

pytestmark = pytest.mark.timeout(120)

_PROBE = r"""
import sys, threading
from castor.supervision import actor
ANY_THREAD = bool(int(sys.argv[2]))
def probe(name):
    real = getattr(actor.Actor, name)
    def wrapped(self, *args, **kwargs):
        if threading.current_thread() is threading.main_thread() or ANY_THREAD:
            print(f"[probe] the main thread runs {name} of {type(self).__name__}", file=sys.stderr, flush=True)
        return real(self, *args, **kwargs)
    setattr(actor.Actor, name, wrapped)
for name in ("handle_envelope", "_actor_loop_setup"):
    probe(name)
from castor.cli.app import main
sys.argv = ["castor", "serve", "--socket", sys.argv[1], "--console", "127.0.0.1:0"]
sys.exit(main())
"""


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["sigterm", "ctrl-c", "sighup"])
def test_no_actor_code_runs_on_serve_s_main_thread_so_a_stop_is_never_held(tmp_path: Path, stop: int) -> None:
    project = tmp_path / "project"
    project.mkdir()
    sock = tmp_path / "castor.sock"
    proc = subprocess.Popen([sys.executable, "-c", _PROBE, str(sock), "0"], env=castor_env(tmp_path), cwd=str(tmp_path),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with killed_on_exit(proc):
        assert proc.stderr is not None
        said = ""
        while "castor serve: listening on" not in said:
            line = proc.stderr.readline()
            assert line, said
            said += line
        client = Client.connect_unix(str(sock), default_timeout=20)
        waiting = threading.Event()
        try:
            def run_turn(params: dict) -> None:
                if params["session_id"] == "s2":
                    waiting.set()  # the second session's turn is never answered: its cast waits on it
                    return
                threading.Thread(target=lambda: client.call(
                    "agent.turn_ended", {"session_id": params["session_id"], "turn_id": params["turn_id"],
                                         "text": "hi", "stop_reason": "stop"}, timeout=20), daemon=True).start()

            client.on_notification("agent.run_turn", run_turn)
            client.on_request("session.append_entry", lambda p: {"ok": True, "entry_id": "e"})
            for sid in ("s1", "s2"):
                client.call("session.open", {"session_id": sid, "cwd": str(project), "trusted": True})
                client.call("loadout.set", {"session_id": sid, "name": "hello"})
            first = client.call("cast.start", {"session_id": "s1", "request": "one"})["cast_id"]
            wait_for(lambda: client.call("cast.status", {"session_id": "s1", "cast_id": first})["status"]
                     == "complete", timeout=30, what="the first cast to complete")
            client.call("cast.start", {"session_id": "s2", "request": "two"})
            assert waiting.wait(20), "the second cast's turn"
            proc.send_signal(stop)
            _out, rest = proc.communicate(timeout=60)
        finally:
            client.close()
    said += rest
    assert proc.returncode == 0, (proc.returncode, said[-3000:])
    assert "[probe]" not in said and "cut loose" not in said and "castor: interrupted" not in said, said[-3000:]
