"""The Icarus backend port: what the Icarus actors need of files and processes.

The Icarus session component resolves its settings from files, writes them back, checks that a
backend package is present and starts worker processes; the worker actor drives one worker
process. Both reach the disk and the process table only through the protocols below, which
:mod:`castor.adapters.icarus` implements (``castor.adapters.icarus.backend.FileIcarusBackend``) and
:mod:`castor.composition` passes in. Tests pass stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from castor.domain.icarus.settings import IcarusSettings, SettingsLayer


@runtime_checkable
class WorkerProcessPort(Protocol):
    """What the worker actor needs from one worker process (the adapter's ``WorkerProcess``
    states the contract: one call at a time, a deadline per call, a kill that takes the tree)."""

    @property
    def running_pid(self) -> int | None: ...

    def call(self, request_id: int, module: str, function: str, args: list[Any] | None,
             kwargs: dict[str, Any] | None, deadline: float | None) -> dict[str, Any]: ...

    def kill_tree(self, reason: str = "retired") -> None: ...

    def exited_while_idle(self) -> bool: ...

    def stats(self) -> Any: ...


class IcarusBackend(Protocol):
    """What the Icarus session component needs from the filesystem and the process table."""

    def load_settings(self, cwd: str, *, trusted: bool) -> IcarusSettings:
        """Effective settings (never raises for bad files; see settings_store)."""
        ...

    def settings_signature(self, path: str) -> tuple[int, ...] | None:
        """What tells this version of a settings file from the next (one ``stat``; None when it
        cannot be stat-ed): equal while the file is unchanged."""
        ...

    def settings_layers(self, cwd: str, *, trusted: bool) -> tuple[SettingsLayer, SettingsLayer]:
        """(project, global) layers as read now; an untrusted project file is not opened."""
        ...

    def update_settings(self, path: str, mutate: Callable[[dict[str, Any]], dict[str, Any]], *,
                        confine_to: str | None = None, owned: bool = False) -> dict[str, Any]:
        """Locked read-modify-write; raises typed errors and then writes nothing. ``confine_to``: the
        file must lie inside that directory (a project's); ``owned``: it must be castor's user's and
        not writable by every user (the global file, as its reads require)."""
        ...

    def package_present(self, icarus_dir: str) -> bool:
        """True when ``icarus_dir`` holds an importable package (``__init__.py``)."""
        ...

    def worker_spawn(self, settings: IcarusSettings, cwd: str) -> Callable[[], WorkerProcessPort]:
        """A callable that *constructs* (does not start) one worker process."""
        ...

    def next_request_id(self) -> int:
        """Process-wide monotonic request ids (never reused across workers)."""
        ...


__all__ = ["IcarusBackend", "WorkerProcessPort"]
