"""The cast-storage port: what materia's actors need of the disk.

A cast persists its state document (revisioned, fenced by incarnation), writes its run
directory's artifacts (files, manifest, event log), and is held by one runtime at a time through
a lease (the holder takes ``castor abort``'s requests for it); a session lists casts through an
index, allocates new cast ids, reads and edits the project's materia config, and kills the
utility commands a dead runtime left running. The
actors reach all of it through :class:`CastStorage`, which
``castor.adapters.materia.storage.FileCastStorage`` implements over the file system and
:mod:`castor.composition` passes in (the way Icarus gets its backend).

The protocols name only what the actors use. Every method raises castor's typed errors
(``not_found``, ``forbidden``, ``conflict``, ``storage_unavailable``...) or an ``OSError`` the
caller classifies with :meth:`CastStorage.is_storage_fault`; none of them blocks on another
runtime (a held lease is an answer, not a wait).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from castor.domain.materia.config import ConfigIssue, ResolvedConfig
from castor.domain.materia.resolve import LoadedConfig
from castor.messages.errors import CastorError, ErrorCode, StorageUnavailable

DEFAULT_PAGE = 50
"""Casts per page of a listing unless the caller asks for another size."""


class StateTooLarge(OSError):
    """A cast's state document over the bound castor saves (errno ``EFBIG``): unlike the file
    system's own ``EFBIG``, no space freed and no storage fixed lets it be saved, so the cast cannot
    go on; a recast would meet the same bound."""


STATE_TOO_LARGE = "state_too_large"
"""``data.reason`` of the ``storage_unavailable`` a cast stopped on by :class:`StateTooLarge`."""


class StateCorrupt(CastorError):
    """``state.json`` exists but is not a valid state document: the data's fault (damaged,
    truncated, written by something else), never castor's, so not ``internal``."""

    code = ErrorCode.STATE_CORRUPT


class StoredDocument(Protocol):
    """A persisted state document, as the actors read it."""

    @property
    def revision(self) -> int: ...

    @property
    def state(self) -> dict[str, Any]: ...

    @property
    def foreign(self) -> str | None:
        """Why another user may have written the document (its file is theirs, or every user
        may write it), else None."""
        ...


class CastSummaryView(Protocol):
    """One row of a cast listing (from the index; no state document read)."""

    @property
    def cast_id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def current_socket(self) -> str | None: ...

    @property
    def updated_at(self) -> str: ...

    @property
    def resumable(self) -> bool: ...

    @property
    def request(self) -> str | None: ...

    @property
    def failed_reason(self) -> str | None: ...

    @property
    def revivable(self) -> bool: ...


class UnreadableCastView(Protocol):
    """A cast directory whose state could not be read, and why."""

    @property
    def cast_id(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def current_socket(self) -> str | None: ...  # a pi-materia run's latest socket, else None

    @property
    def request(self) -> str | None: ...  # a pi-materia run's request, else None


class CastPageView(Protocol):
    """One page of a listing: casts newest id first, then the unreadable directories."""

    @property
    def casts(self) -> Sequence[CastSummaryView]: ...

    @property
    def problems(self) -> Sequence[UnreadableCastView]: ...

    @property
    def next_cursor(self) -> str | None: ...

    @property
    def total(self) -> int: ...


class EventRecordView(Protocol):
    """One line of a cast's event log."""

    def model_dump(self) -> dict[str, Any]: ...


class EventLogView(Protocol):
    """The readable events of a cast (torn or corrupt lines are left out)."""

    @property
    def events(self) -> Sequence[EventRecordView]: ...


class CastFiles(Protocol):
    """One cast's run directory: atomic files, the manifest, the append-only event log."""

    @property
    def run_dir(self) -> Path: ...

    def create(self) -> object: ...

    def init_manifest(self, *, request: str, config_source: str, session_file: str | None = None) -> Path: ...

    def add_manifest_entry(self, entry: dict[str, Any]) -> dict[str, Any]: ...

    def read_manifest(self) -> dict[str, Any]: ...

    def append_event(self, type: str, data: dict[str, Any] | None = None, *, ts_ms: int | None = None) -> object: ...

    def read_events(self) -> EventLogView: ...

    def write_relative(self, relative: str, content: str | bytes | dict[str, Any] | list[Any]) -> Path: ...

    def write_transition(self, files: dict[str, str | bytes], entries: list[dict[str, Any]],
                         events: list[tuple[str, dict[str, Any], int]], *,
                         data_json: Sequence[str | None] | None = None) -> None: ...

    def forget_kept(self) -> None:
        """Drop what is kept between writes (the manifest's text, the paths checked): the cast waits."""
        ...


#: A state document serialised as JSON: text, bytes, or bytes in pieces whose concatenation is the
#: document (a store joins the pieces once, with its own header, instead of copying a joined whole).
EncodedState = str | bytes | Sequence[bytes | memoryview]


class CastStore(Protocol):
    """The state documents under one (resolved) artifact root."""

    def artifacts(self, cast_id: str) -> CastFiles: ...

    def load(self, cast_id: str) -> StoredDocument: ...

    def claim_loaded(self, cast_id: str, *, at_least: int = 1, fresh: bool = False) -> tuple[int, StoredDocument]: ...

    def save_encoded(self, cast_id: str, state_json: EncodedState, *, incarnation: int,
                     expected_revision: int | None = None, index: Any = None) -> tuple[int, int, str]: ...


class CastHold(Protocol):
    """This runtime's lease on one cast (released exactly once; releasing again does nothing)."""

    def release(self) -> None: ...


class ConfigCache(Protocol):
    """Resolved configs, re-read only when a layer file changed."""

    def load_resolved(self, cwd: str | os.PathLike[str], *, loadout: str | None = None,
                      config_path: str | os.PathLike[str] | None = None) -> ResolvedConfig: ...


class CastStorage(Protocol):
    """Everything materia's actors do on disk (see the module docstring)."""

    # -- errors
    def is_storage_fault(self, exc: BaseException) -> bool:
        """True for an ``OSError`` that means the storage failed (disk full, read-only, I/O error)."""
        ...

    def storage_unavailable(self, exc: OSError, *, path: str | os.PathLike[str] | None = None,
                            base: str | os.PathLike[str] | None = None, action: str = "write") -> StorageUnavailable:
        """The typed ``storage_unavailable`` error for ``exc`` (paths relative to ``base``)."""
        ...

    # -- casts
    def validate_cast_id(self, cast_id: object) -> str:
        """``cast_id`` if it is a safe single path segment, else ``forbidden``."""
        ...

    def allocate_cast_id(self, artifact_root: Path, *, root_resolved: bool = False, index_later: bool = False) -> str:
        """A new, unused cast id under ``artifact_root`` (its directory is created). ``index_later``:
        its index row is written by :meth:`index_new_cast` (a start: on the cast's thread, after the
        starter's answer), not now; until then a listing finds it by the root's changed signature."""
        ...

    def index_new_cast(self, artifact_root: Path, cast_id: str) -> None:
        """Write the index row ``allocate_cast_id(..., index_later=True)`` left, if not written yet
        (a row there by then is kept); :meth:`discard_unsaved` drops it."""
        ...

    def store(self, artifact_root: Path, *, resolved: bool = False) -> CastStore: ...

    def files(self, artifact_root: Path, cast_id: str) -> CastFiles: ...

    def event_lines(self, artifact_root: Path, cast_id: str) -> list[Any]:
        """Every complete, parseable line of the cast's event log, in order."""
        ...

    def last_event(self, artifact_root: Path, cast_id: str) -> Any:
        """The last complete line of the cast's event log, parsed (one bounded read, whatever the
        log's length); None when there is none or it is not JSON."""
        ...

    def discard_unsaved(self, artifact_root: Path, cast_id: str) -> bool:
        """Remove a cast directory that holds no saved state; True if it was removed."""
        ...

    def try_lease(self, artifact_root: Path, cast_id: str, *, root_resolved: bool = False,
                  fresh: bool = False) -> CastHold | None:
        """This runtime's lease on the cast, or None when a live runtime holds it. ``fresh``: the
        cast's run directory was just made by ``allocate_cast_id`` (private from its creation)."""
        ...

    def lease_held(self, artifact_root: Path, cast_id: str) -> bool:
        """Whether some live runtime holds the cast's lease now (a read-only probe)."""
        ...

    def watch_abort_requests(self, run_dir: Path, since: float, on_asked: Callable[[], None],
                             warn: Callable[[str], None]) -> Callable[[], None]:
        """Look for ``castor abort``'s request in the run directory of a cast this runtime holds
        until the returned function is called (idempotent): ``on_asked`` once per request made
        since ``since`` (taken before the lease), ``warn`` naming anything else found there, which
        is removed and never applied. Both are called on a watcher thread and must not wait. Cheap:
        a stat per watched cast per poll, nothing per transition."""
        ...

    def list_page(self, artifact_root: Path, *, limit: int | None = DEFAULT_PAGE,
                  cursor: str | None = None) -> CastPageView: ...

    def newest(self, artifact_root: Path, where: str) -> Iterator[CastSummaryView]: ...

    def write_json(self, path: Path, value: Any) -> None:
        """Atomically replace ``path`` with ``value`` as JSON."""
        ...

    def note_in_cli_json(self, run_dir: Path, key: str, value: list[str] | None) -> bool:
        """Set ``key`` of the run directory's ``cli.json`` to ``value`` (remove it for None),
        keeping its other entries; True if the file changed. A ``cli.json`` that cannot be read as a
        JSON object (or is no small regular file) is left as it is (False); one that is missing is
        made. ``OSError`` when it cannot be written."""
        ...

    def kill_recorded(self, run_dir: Path, cast_id: str, *, keep: str | None = None) -> list[int]:
        """Kill the utility commands recorded as running in ``run_dir``; their pids. The records are
        removed, but ``keep``'s (a visit whose recorded outcome the cast takes)."""
        ...

    def cluster_fence_s(self, run_dir: Path, cast_id: str) -> float:
        """How long a runtime taking up the cast must hold its commands: a command of it started on a
        cluster by a cast host that never saw it end may still run there that long (0: none). Read
        before :meth:`kill_recorded`, which removes the records."""
        ...

    def finished_command(self, run_dir: Path, cast_id: str, visit_id: str) -> dict[str, Any] | None:
        """The outcome recorded for the command of ``visit_id`` as it ended (the utility runner's
        ``record_outcome``), else None: it ended before its runtime died, and the cast takes this
        outcome instead of running it again."""
        ...

    def interrupted_command(self, run_dir: Path, cast_id: str, visit_id: str) -> bool:
        """True when the command of ``visit_id`` was started and no outcome was recorded: it was
        running when its runtime died (or its cast's actor was lost), and runs again from the
        start if the cast re-dispatches it."""
        ...

    def forget_command(self, run_dir: Path, visit_id: str) -> None:
        """Remove the record of the command of ``visit_id`` (its outcome is saved in the state)."""
        ...

    # -- the project's materia config
    def config_cache(self) -> ConfigCache: ...

    def load_config(self, cwd: str | os.PathLike[str], *,
                    config_path: str | os.PathLike[str] | None = None) -> LoadedConfig: ...

    def save_active_loadout(self, cwd: str | os.PathLike[str], name: str, *,
                            config_path: str | os.PathLike[str] | None = None) -> Path: ...

    def confine(self, root: str | os.PathLike[str], value: str, *, allow_absolute: bool = False) -> Path:
        """The real location of the user path ``value`` under ``root``, or ``forbidden``."""
        ...

    def validate_config_file(self, path: str | os.PathLike[str], *,
                             project: str | os.PathLike[str] | None = None,
                             config_path: str | os.PathLike[str] | None = None) -> list[ConfigIssue]:
        """The issues of the config a cast in ``project`` would run with ``path``: the same layers
        (bundled default, profile, project, explicit; ``path`` in the project's or the explicit
        place) and what that cast would refuse (an ``artifactDir`` outside the project). Without
        ``project``: ``path`` over the bundled default only. ``config_path``: the cast's explicit
        layer (a session's ``--materia-config``), above ``path`` when ``path`` is the profile's or
        the project's file."""
        ...


__all__ = [
    "DEFAULT_PAGE", "CastFiles", "CastHold", "CastPageView", "CastStorage", "CastStore", "CastSummaryView",
    "ConfigCache", "EventLogView", "EventRecordView", "StateCorrupt", "StoredDocument", "UnreadableCastView",
]
