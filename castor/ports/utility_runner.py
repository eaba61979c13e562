"""The utility runner port: how materia's utility pool starts commands and built-ins.

The pool (``castor.actors.materia.utility_pool``) runs one ``RunUtility`` effect per slot. It
reaches processes, files and the built-ins only through a :class:`UtilityRunner` handed to it
when the runtime builds the pool (``castor.adapters.materia.local_utilities`` is the one that
runs them on this machine; a cast host on a cluster starts commands as cluster tasks instead).

What a runner guarantees (the adapter's tests pin each):

- ``spawn`` starts the command with no shell, in ``cwd``, the cast input as JSON on stdin; it
  raises :class:`UtilitySpawnError` when no process ran at all;
- the :class:`RunningCommand` it returns ends the whole process tree on ``kill`` (the result
  is marked ``killed``) or ``terminate`` (SIGTERM, then SIGKILL after the grace);
- ``record_running`` writes the command's record before the command can run, so a runtime that
  starts after this one died can find and kill it; ``record_outcome`` writes the outcome into it as
  the command ends (the cast's storage removes it once the cast has saved that outcome), and
  ``forget`` removes the record of a command that ended without one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from castor.messages.errors import CastorError, ErrorCode

VISIT_ID_ENV = "CASTOR_VISIT_ID"
"""The dispatch's visit id, in the command's environment: an idempotency key, never reused."""
RUN_DIR_ENV = "CASTOR_RUN_DIR"
"""The cast's run directory, in the command's environment."""
RUNTIME_PID_ENV = "CASTOR_RUNTIME_PID"
"""Which runtime started the command (the CLI's last-resort kill)."""

MAX_OUTPUT_BYTES = 1024 * 1024
DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_GRACE_MS = 1_000
_READ_CHUNK = 64 * 1024
_PIPE_DRAIN_AFTER_KILL_S = 2.0


class UtilitySpawnError(CastorError):
    """The command could not be started at all (no process ran)."""

    code = ErrorCode.INTERNAL


class UtilityCommand(BaseModel):
    """One command to run."""

    model_config = ConfigDict(frozen=True)

    argv: list[str] = Field(min_length=1)
    cwd: Path
    stdin: Any = None
    timeout_ms: int = Field(default=DEFAULT_TIMEOUT_MS, gt=0)
    grace_ms: int = Field(default=DEFAULT_GRACE_MS, ge=0)
    max_output_bytes: int = Field(default=MAX_OUTPUT_BYTES, gt=0)
    env: dict[str, str] | None = None  # None: inherit the process environment unchanged

    @field_validator("argv")
    @classmethod
    def _argv_is_clean(cls, argv: list[str]) -> list[str]:
        for arg in argv:
            if "\x00" in arg:
                raise ValueError("argv entries must not contain NUL")
        if not argv[0]:
            raise ValueError("argv[0] must be a non-empty program name")
        return argv


class UtilityResult(BaseModel):
    """What happened to one command."""

    model_config = ConfigDict(frozen=True)

    argv: list[str]
    pid: int
    exit_code: int | None
    signal: int | None
    signal_name: str | None
    timed_out: bool
    killed: bool
    duration_ms: float
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    max_bytes: int
    timeout_ms: int

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.killed


class RunningCommand(Protocol):
    """One started command."""

    @property
    def finished(self) -> bool: ...

    def pids(self) -> list[int]: ...

    def wait(self) -> UtilityResult: ...

    def kill(self) -> None: ...

    def terminate(self, grace_s: float) -> None: ...


class UtilityRunner(Protocol):
    """What the utility pool needs to run commands and built-ins."""

    def spawn(self, cmd: UtilityCommand) -> RunningCommand:
        """Start ``cmd`` (``UtilitySpawnError`` when nothing ran)."""
        ...

    def run_builtin(self, name: str, params: dict[str, Any], *, cwd: str) -> str:
        """Run the built-in ``name``; its output text."""
        ...

    def record_path(self, run_dir: str, visit_id: str) -> Path:
        """Where the record of the command of ``visit_id`` lives under ``run_dir``."""
        ...

    def record_running(self, path: Path, visit_id: str, *, cluster_fence_s: float | None = None) -> bool:
        """Write the record before the command starts (``cluster_fence_s``: it starts on a cluster,
        and may run on that long after its cast host is lost)."""
        ...

    def record_outcome(self, path: Path, visit_id: str, outcome: dict[str, Any]) -> None:
        """Write the outcome of the command that has just ended into its record, durably, before
        the cast is told: a runtime killed before the cast saved it leaves it for the recast."""
        ...

    def forget(self, path: Path) -> None:
        """Remove the record of a command that ended without an outcome (killed, never started)."""
        ...


__all__ = [
    "DEFAULT_GRACE_MS", "DEFAULT_TIMEOUT_MS", "MAX_OUTPUT_BYTES", "RUNTIME_PID_ENV", "RUN_DIR_ENV", "VISIT_ID_ENV",
    "RunningCommand", "UtilityCommand", "UtilityResult", "UtilityRunner", "UtilitySpawnError",
]
