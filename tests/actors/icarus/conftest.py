"""Fixtures: a real Runtime with the Icarus component over the REFERENCE BACKEND (a stand-in
for the private Icarus plugin) in real worker subprocesses. Only what cannot exist here is
faked: the classifier model (tests/support/icarus_fakes.FakeClassifier) and the harness UI
(a recorder). The session log is the real JSONL adapter in tmp.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from castor.actors.icarus.component import session_of
from castor.adapters.session_jsonl import JsonlSessionLog
from castor.runtime import HarnessLink, Runtime, SessionInfo
from castor.supervision import ActorSystem
from tests.support.icarus import REFERENCE_ICARUS, IcarusWorldBase, read_jsonl
from tests.support.icarus_fakes import FakeClassifier
from tests.support.icarus_worker import harness  # noqa: F401 - the worker tests' fixture, re-exported for this directory


@pytest.fixture
def system():
    """A bare actor system, shut down after the test (the controller and filter tests' rigs)."""
    s = ActorSystem()
    yield s
    s.shutdown(10)

class GatedLog:
    """The real JSONL session log behind a gate the test opens (to observe ordering)."""

    def __init__(self, inner: JsonlSessionLog) -> None:
        self.inner = inner
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def append_entry(self, custom_type: str, data: dict[str, Any], deadline: float, *,
                     expires: bool = False) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(max(0.0, deadline - time.monotonic()))
        self.inner.append_entry(custom_type, data, deadline, expires=expires)


class World(IcarusWorldBase):
    """One test's filesystem, settings, runtime and harness fakes."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.classifier = FakeClassifier(reject_words=("cake",))
        self.session_log = GatedLog(JsonlSessionLog(self.session_log_path))
        self.write_global()

    def seed(self, *entries: tuple[str, str], facts: tuple[str, ...] = ()) -> None:
        """Write Fabric entries with the reference backend's own storage code."""
        code = ("import sys, json; sys.path.insert(0, sys.argv[1]); from icarus import state\n"
                "data = json.loads(sys.argv[2])\n"
                "for s, c in data['entries']: state.write_entry(summary=s, content=c)\n"
                "for f in data['facts']: state.add_fact(f)\n")
        subprocess.run([sys.executable, "-c", code, str(REFERENCE_ICARUS.parent),
                        json.dumps({"entries": entries, "facts": facts})],
                       check=True, timeout=30, env={"FABRIC_DIR": str(self.fabric), "PATH": "/usr/bin:/bin"})

    # -- runtime ----------------------------------------------------------------
    def link(self, *, classifier: Any = "default", session_log: Any = "default") -> HarnessLink:
        return HarnessLink(agent=None,
                           session_log=self.session_log if session_log == "default" else session_log,
                           ui=self.ui,
                           classifier=self.classifier if classifier == "default" else classifier)

    def open(self, rt: Runtime, sid: str = "s1", *, trusted: bool = False, **link: Any):
        ctx = rt.open_session(SessionInfo(session_id=sid, cwd=str(self.project), trusted=trusted), self.link(**link))
        return ctx, session_of(ctx)

    # -- observations -----------------------------------------------------------
    def audits(self) -> list[dict[str, Any]]:
        return [e for e in read_jsonl(self.session_log_path) if e.get("customType") == "icarus-context-filter"]


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.close()
