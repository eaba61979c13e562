"""The Icarus worker harness: the reference backend in a real subprocess, per test.

The ``harness`` fixture is re-exported by the conftest of each directory whose tests use it
(tests/actors/icarus, tests/adapters/icarus)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from castor.adapters.icarus.launch import build_launch
from castor.adapters.icarus.worker_process import WorkerProcess
from castor.domain.icarus.settings import IcarusSettings
from tests.support.icarus import REFERENCE_ICARUS, read_jsonl


class Harness:
    """Builds workers on the reference backend inside a per-test project dir."""

    def __init__(self, tmp_path: Path) -> None:
        self.project = tmp_path / "project"
        self.project.mkdir()
        self.call_log = tmp_path / "calls.jsonl"
        self.fabric = tmp_path / "fabric"
        self.workers: list[WorkerProcess] = []

    def settings(self, **overrides) -> IcarusSettings:
        values = dict(icarus_dir=str(REFERENCE_ICARUS), fabric_dir=str(self.fabric), python=sys.executable,
                      agent="test-agent", project_id="test-project")
        values.update(overrides)
        return IcarusSettings(**values)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["ICARUS_REF_CALL_LOG"] = str(self.call_log)
        env.update(extra)
        return env

    def launch(self, settings: IcarusSettings | None = None, **env: str):
        return build_launch(settings or self.settings(), cwd=str(self.project), parent_env=self.env(**env))

    def worker(self, launch=None, **kwargs) -> WorkerProcess:
        worker = WorkerProcess(launch or self.launch(), **kwargs)
        self.workers.append(worker)
        return worker

    def calls(self, name: str | None = None, phase: str = "start") -> list[dict]:
        return [r for r in read_jsonl(self.call_log)
                if r["phase"] == phase and (name is None or r["call"] == name)]

    def close(self) -> None:
        for worker in self.workers:
            worker.kill_tree("test teardown")


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path)
    yield h
    h.close()
