"""``castor serve --stdio --backend ray`` driven over msgpack-rpc as a harness drives it.

The server runs in a private network namespace (it starts a local Ray there); its stdio reaches
this test's client. The client is the harness: it answers ``agent.run_turn`` notifications (which
cross the relay from the cast host to the serving process) with ``agent.turn_ended``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from castor.client import Client

from .netns import REPO, require_ray

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

COMMAND = ("import os, sys, json, time\nsys.stdin.readline()\n"
           "open(os.environ['VISIT_LOG'], 'a').write(os.environ['CASTOR_VISIT_ID'] + '\\n')\n"
           "time.sleep(1.5)\nprint(json.dumps({'ok': True}))\n")


class Harness:
    """Answers every castor turn with a short text, off the reading thread."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.turns: list[dict[str, Any]] = []
        client.on_notification("agent.run_turn", self._run_turn)
        client.on_request("session.append_entry", lambda params: {"ok": True, "entry_id": "e"})
        client.on_notification("ui.notify", lambda params: None)
        client.on_notification("ui.status", lambda params: None)

    def _run_turn(self, params: dict[str, Any]) -> None:
        self.turns.append(params)

        def answer() -> None:
            try:
                self.client.call("agent.turn_ended", {"session_id": params["session_id"], "turn_id": params["turn_id"],
                                                      "text": "done", "stop_reason": "stop"}, timeout=30)
            except Exception:  # noqa: BLE001 - a turn of a lost host: castor no longer waits for it
                pass

        threading.Thread(target=answer, daemon=True).start()


def _project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / ".pi").mkdir(parents=True)
    (proj / ".pi" / "pi-materia.json").write_text(json.dumps({"activeLoadout": "dist", "loadouts": {"dist": {
        "entry": "Socket-1", "sockets": {
            "Socket-1": {"type": "agent", "materia": "greeter", "edges": [{"when": "always", "to": "Socket-2"}]},
            "Socket-2": {"type": "utility", "command": [sys.executable, "-c", COMMAND], "parse": "json",
                         "resources": {"cpus": 1}, "edges": [{"when": "always", "to": "Socket-3"}]},
            "Socket-3": {"type": "agent", "materia": "summarizer"}}}}}))
    return proj


def _wait_status(client: Client, sid: str, cast_id: str, want: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = client.call("cast.status", {"session_id": sid, "cast_id": cast_id})
        if view["status"] == want:
            return view
        time.sleep(0.1)
    raise AssertionError(f"cast {cast_id} is {view.get('status')}, not {want}: {view}")


def test_a_harness_drives_casts_on_ray_hosts_and_survives_a_host_kill(tmp_path: Path) -> None:
    require_ray()
    import os

    proj = _project(tmp_path)
    visit_log = tmp_path / "visits.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "VISIT_LOG": str(visit_log), "RAY_USAGE_STATS_ENABLED": "0"}
    argv = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable, "-m", "castor",
            "serve", "--stdio", "--backend", "ray", "--ray-hosts", "2", "--allow-faults"]
    with Client.spawn_stdio(argv, env=env, default_timeout=60) as client:
        harness = Harness(client)
        hello = client.call("runtime.hello", {"client": "test", "capabilities": ["agent.run_turn"]}, timeout=120)
        assert "ops.hosts" in hello["methods"]
        client.call("session.open", {"session_id": "s1", "cwd": str(proj), "trusted": True}, timeout=60)
        hosts = client.call("ops.hosts", {})
        assert hosts["backend"] == "ray" and len(hosts["hosts"]) == 2, hosts
        # one cast end to end: its turns cross the relay to this harness and back
        first = client.call("cast.start", {"session_id": "s1", "request": "first"})
        _wait_status(client, "s1", first["cast_id"], "complete", 90)
        assert len(harness.turns) == 2
        # its cli.json names the cluster, written by the cast host's runtime (where the cast's session
        # actor runs): before, only the serving process's runtime had the note, and nothing was written
        note = json.loads((proj / ".pi" / "pi-materia" / first["cast_id"] / "cli.json").read_text())
        assert note == {"backendFlags": ["--backend", "ray", "--ray-hosts", "2"]}, note
        # a second cast, its host killed while the utility command runs
        second = client.call("cast.start", {"session_id": "s1", "request": "second"})
        deadline = time.monotonic() + 60
        while not (visit_log.exists() and len(visit_log.read_text().split()) >= 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        holder = next(h for h in client.call("ops.hosts", {})["hosts"] if h["sessions"] == ["s1"])
        assert any(second["cast_id"] in path for path in holder["casts"]), holder
        # What an operator sees (castor inspect actors / casts): the cast's actors on its host, labelled
        # with it (before, only the serving process's actors: `inspect casts` said "no casts").
        actors = client.call("ops.actors", {"prefix": "/root/session/s1"})["actors"]
        cast_actor = next((a for a in actors if a["path"] == f"/root/session/s1/cast/{second['cast_id']}"), None)
        assert cast_actor is not None and cast_actor["labels"].get("host") == holder["host_id"], actors
        assert [a["kind"] for a in actors if a["path"] == "/root/session/s1/materia"] == ["RemoteSessionActor"]
        client.call("ops.fault", {"kind": "kill_host", "path": holder["host_id"]})
        view = _wait_status(client, "s1", second["cast_id"], "complete", 120)
        after = client.call("ops.hosts", {})["hosts"]
        assert any(h["host_id"] == holder["host_id"] and not h["alive"] for h in after), after
        assert any(h["alive"] and h["sessions"] == ["s1"] for h in after), after
        visits = visit_log.read_text().split()
        assert len(visits) == len(set(visits)), visits  # a new visit id for the re-dispatch, never one twice
        assert view["status"] == "complete"
        # A harness's abort of a cast on a host is answered with the harness's recast (the host's session
        # said `castor recast ID`, which a cast a harness ran cannot take as typed: no agent for it)
        third = client.call("cast.start", {"session_id": "s1", "request": "third"})
        ran = len(visit_log.read_text().split())
        deadline = time.monotonic() + 60
        while len(visit_log.read_text().split()) <= ran and time.monotonic() < deadline:
            time.sleep(0.05)
        aborted = client.call("cast.abort", {"session_id": "s1", "cast_id": third["cast_id"]})
        assert f"Recast it with /materia recast {third['cast_id']}." in aborted["text"], aborted["text"]
