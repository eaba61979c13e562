"""The utility runner of this machine: commands as local process trees, built-ins in process.

Implements :class:`castor.ports.utility_runner.UtilityRunner` over
:mod:`castor.adapters.materia.process_runner` (no shell, capped output, deadlines, whole trees
killed), :mod:`castor.adapters.materia.builtins` and :mod:`castor.adapters.materia.command_records`;
the runtime hands it to the utility pool it starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from castor.adapters.materia import command_records
from castor.adapters.materia.builtins import run_builtin
from castor.adapters.materia.process_runner import RunningUtility, spawn
from castor.ports.utility_runner import UtilityCommand


class LocalUtilityRunner:
    """Runs utility commands and built-ins on this machine (see the module docstring)."""

    def spawn(self, cmd: UtilityCommand) -> RunningUtility:
        return spawn(cmd)

    def run_builtin(self, name: str, params: dict[str, Any], *, cwd: str) -> str:
        return run_builtin(name, params, cwd=cwd)

    def record_path(self, run_dir: str, visit_id: str) -> Path:
        return command_records.record_path(run_dir, visit_id)

    def record_running(self, path: Path, visit_id: str, *, cluster_fence_s: float | None = None) -> bool:
        return command_records.record_running(path, visit_id, cluster_fence_s=cluster_fence_s)

    def record_outcome(self, path: Path, visit_id: str, outcome: dict[str, Any]) -> None:
        command_records.record_outcome(path, visit_id, outcome)

    def forget(self, path: Path) -> None:
        command_records.forget(path)


LOCAL_UTILITY_RUNNER = LocalUtilityRunner()
"""The one local runner (it holds no state)."""

__all__ = ["LOCAL_UTILITY_RUNNER", "LocalUtilityRunner"]
