"""Shared set-up for the materia actor tests: a real Runtime, real files, the scripted agent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from castor.actors.materia.api import materia_call
from castor.adapters.agents.scripted import ScriptedAgent, parse_script
from castor.adapters.materia.artifacts import CastArtifacts
from castor.adapters.stderr_ui import StderrUi
from castor.composition import materia_component
from castor.runtime import HarnessLink, Runtime, RuntimeSettings, SessionInfo
from tests.support.waiting import wait_for  # noqa: F401 - re-exported for the materia actor tests

TERMINAL = ("complete", "failed", "aborted")


def make_runtime(**settings: Any) -> Runtime:
    return Runtime(RuntimeSettings(**settings), components=[materia_component()])


def open_session(rt: Runtime, sid: str, cwd: Path, script: Any, *, trusted: bool = True,
                 session_log: Any = None) -> tuple[ScriptedAgent, StderrUi]:
    agent = ScriptedAgent(parse_script(script))
    ui = StderrUi(printer=lambda _line: None)
    rt.open_session(SessionInfo(session_id=sid, cwd=str(cwd), trusted=trusted),
                    HarnessLink(agent=agent, session_log=session_log, ui=ui))
    return agent, ui


def wait_status(rt: Runtime, sid: str, cast_id: str, statuses: tuple[str, ...] = TERMINAL,
                timeout: float = 10.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        view = materia_call(rt, sid, "status", {"cast_id": cast_id})
        return view if view["status"] in statuses else None

    return wait_for(check, timeout=timeout, what=f"cast {cast_id} in {statuses}")


def events(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir)
    arts = CastArtifacts(path.parent, path.name)
    return [e.model_dump() for e in arts.read_events().events]


def event_types(run_dir: str | Path) -> list[str]:
    return [e["type"] for e in events(run_dir)]


def write_project_config(cwd: Path, config: dict[str, Any]) -> None:
    (cwd / ".pi").mkdir(parents=True, exist_ok=True)
    (cwd / ".pi" / "pi-materia.json").write_text(json.dumps(config))


def plan_json(*items: str) -> str:
    return json.dumps({"summary": "plan", "workItems": [
        {"id": i, "title": f"item {i}", "description": f"do {i}", "acceptance": [f"{i} works"],
         "context": {"constraints": [], "dependencies": [], "risks": []}} for i in items]})


def verdict(satisfied: bool, feedback: str = "") -> str:
    return json.dumps({"satisfied": satisfied, "feedback": feedback, "missing": []})


class ServedRuntime:
    """One runtime behind a real Unix-socket server; :meth:`connect` attaches one Pi-like harness
    process to it (``harness_class(client)``) and opens session ``session_id`` as Pi does."""

    def __init__(self, tmp_path: Path, project: Path, harness_class: Any, session_id: str, **settings: Any) -> None:
        from castor.endpoint.app import build_dispatcher
        from castor.endpoint.server import Server

        self.project = project
        self.sock = str(tmp_path / "castor.sock")
        self.runtime = make_runtime(**settings)
        self.server = Server(build_dispatcher(self.runtime), unix_path=self.sock).start()
        self.clients: list[Any] = []
        self._harness_class = harness_class
        self._session_id = session_id

    def connect(self) -> Any:
        from castor.client import Client

        client = Client.connect_unix(self.sock, default_timeout=15)
        self.clients.append(client)
        pi = self._harness_class(client)
        client.call("runtime.hello", {"client": "pi-like-test"})
        client.call("session.open", {"session_id": self._session_id, "cwd": str(self.project), "trusted": True,
                                     "flags": {"harness": "pi", "has_agent_settled": True}})
        return pi

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.server.stop()
        self.runtime.shutdown(10)

