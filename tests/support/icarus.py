"""Small helpers shared by the Icarus test areas (session, security, conformance).

``RecordingUi`` is a TEST FAKE of SessionUiPort; the rest read real files and
real processes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from tests.support.processes import process_gone as gone  # noqa: F401 - re-exported for the Icarus tests
from tests.support.waiting import wait_for as wait_until  # noqa: F401 - re-exported for the Icarus tests


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class RecordingUi:
    """TEST FAKE of SessionUiPort: records every call in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def send_message(self, custom_type: str, content: str, *, display: bool, trigger_turn: bool = False) -> None:
        with self._lock:
            self.calls.append(("message", {"custom_type": custom_type, "content": content, "display": display,
                                           "trigger_turn": trigger_turn}))

    def set_status(self, key: str, text: str | None) -> None:
        with self._lock:
            self.calls.append(("status", (key, text)))

    def notify(self, message: str, level: str = "info", *, code: str | None = None) -> None:
        with self._lock:
            self.calls.append(("notify", (message, level)))

    def of(self, kind: str) -> list[Any]:
        with self._lock:
            return [v for k, v in self.calls if k == kind]


REFERENCE_ICARUS = Path(__file__).resolve().parents[2] / "examples" / "icarus_reference" / "icarus"


class IcarusWorldBase:
    """TEST scaffolding: a project, a global Pi agent dir whose ``piIcarusHook`` points at the
    labelled reference backend, its call log and control file, and the runtimes a test starts.

    The Icarus test areas subclass it with their own classifier and session log.
    """

    CLASSIFIER = "ollama/qwen3:4b"

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.project = tmp / "project"
        self.project.mkdir()
        self.agent_dir = tmp / "agent"
        self.agent_dir.mkdir()
        self.fabric = tmp / "fabric"
        self.call_log = tmp / "calls.jsonl"
        self.control_file = tmp / "controls.json"
        self.session_log_path = tmp / "session.jsonl"
        self.global_path = self.agent_dir / "settings.json"
        self.project_path = self.project / ".pi" / "settings.json"
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PI_CODING_AGENT_DIR": str(self.agent_dir),
                    "ICARUS_REF_CALL_LOG": str(self.call_log), "ICARUS_REF_CONTROL_FILE": str(self.control_file)}
        self.ui = RecordingUi()
        self.runtimes: list[Any] = []

    # -- settings ---------------------------------------------------------------
    def section(self, **extra: Any) -> dict[str, Any]:
        return {"icarusDir": str(REFERENCE_ICARUS), "python": sys.executable, "fabricDir": str(self.fabric),
                "classifier": self.CLASSIFIER, "classifierTimeoutMs": 3000, "timeoutMs": 10000, **extra}

    def write_global(self, doc: dict[str, Any] | None = None, **extra: Any) -> None:
        self.global_path.write_text(json.dumps(doc if doc is not None else {"piIcarusHook": self.section(**extra)}))

    def write_project(self, section: dict[str, Any]) -> None:
        self.project_path.parent.mkdir(exist_ok=True)
        self.project_path.write_text(json.dumps({"piIcarusHook": section}))

    def controls(self, controls: dict[str, Any]) -> None:
        """Faults for the reference backend (re-read on every call), written atomically."""
        tmp = self.control_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(controls))
        os.replace(tmp, self.control_file)

    # -- runtime and observations -------------------------------------------------
    def runtime(self) -> Any:
        from castor.composition import icarus_component
        from castor.runtime import Runtime, RuntimeSettings

        rt = Runtime(RuntimeSettings(), components=[icarus_component(env=self.env, home=str(self.tmp))])
        self.runtimes.append(rt)
        return rt

    def calls(self, name: str | None = None, phase: str = "start") -> list[dict[str, Any]]:
        """The reference backend's logged calls (of ``name``, in ``phase``)."""
        return [r for r in read_jsonl(self.call_log) if r["phase"] == phase and (name is None or r["call"] == name)]

    def close(self) -> None:
        for rt in self.runtimes:
            rt.shutdown(timeout=10)


def serve_icarus_on_loopback(runtime: Any, token: str) -> Any:
    """A started :class:`castor.endpoint.Server` on 127.0.0.1 (a free port) with ``token``, serving
    ``runtime``'s session, ops and icarus methods -- what ``castor serve --tcp`` serves a harness."""
    from castor.endpoint import Dispatcher, Server
    from castor.endpoint.methods.icarus import register_icarus_methods
    from castor.endpoint.methods.ops import register_ops_methods
    from castor.endpoint.methods.session import register_session_methods

    dispatcher = Dispatcher()
    register_session_methods(dispatcher, runtime)
    register_ops_methods(dispatcher, runtime)
    register_icarus_methods(dispatcher, runtime)
    return Server(dispatcher, tcp=("127.0.0.1", 0), token=token).start()
