"""The file-system implementation of the cast-storage port (:mod:`castor.ports.cast_storage`).

:class:`FileCastStorage` holds no state of its own (the one thing kept between calls, a start's
index row left for the cast's thread, is the artifacts module's): each method is the adapter function of the
same job (state store, artifacts, lease, abort requests, index listing, config loader, command
records), so every guarantee those modules state holds unchanged. :data:`FILE_CAST_STORAGE` is the one
instance the composition root and the CLI pass around.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from castor.adapters import fs
from castor.adapters.materia import abort_requests, command_records, config_loader
from castor.adapters.materia.artifacts import (
    CastArtifacts,
    allocate_cast_id,
    allocate_cast_id_indexed_later,
    forget_allocated,
    index_allocated,
    validate_cast_id,
)
from castor.adapters.materia.cast_lease import CastLease
from castor.adapters.materia.state_store import (
    CastPage,
    CastStateStore,
    CastSummary,
    discard_unsaved,
    list_page,
    newest,
)
from castor.domain.materia.config import ConfigIssue
from castor.domain.materia.resolve import LoadedConfig
from castor.messages.errors import StorageUnavailable
from castor.ports.cast_storage import DEFAULT_PAGE, CastStorage


class FileCastStorage:
    """Casts as directories under an artifact root (see the adapter modules for the formats)."""

    def is_storage_fault(self, exc: BaseException) -> bool:
        return fs.is_storage_fault(exc)

    def storage_unavailable(self, exc: OSError, *, path: str | os.PathLike[str] | None = None,
                            base: str | os.PathLike[str] | None = None, action: str = "write") -> StorageUnavailable:
        return fs.storage_unavailable(exc, path=path, base=base, action=action)

    def validate_cast_id(self, cast_id: object) -> str:
        return validate_cast_id(cast_id)

    def allocate_cast_id(self, artifact_root: Path, *, root_resolved: bool = False, index_later: bool = False) -> str:
        if index_later:
            return allocate_cast_id_indexed_later(artifact_root, root_resolved=root_resolved)
        return allocate_cast_id(artifact_root, root_resolved=root_resolved)

    def index_new_cast(self, artifact_root: Path, cast_id: str) -> None:
        index_allocated(artifact_root, cast_id)

    def store(self, artifact_root: Path, *, resolved: bool = False) -> CastStateStore:
        return CastStateStore(artifact_root, resolved=resolved)

    def files(self, artifact_root: Path, cast_id: str) -> CastArtifacts:
        return CastArtifacts(artifact_root, cast_id)

    def event_lines(self, artifact_root: Path, cast_id: str) -> list[Any]:
        return CastArtifacts(artifact_root, cast_id).event_lines().records

    def last_event(self, artifact_root: Path, cast_id: str) -> Any:
        return CastArtifacts(artifact_root, cast_id).last_event_line()

    def discard_unsaved(self, artifact_root: Path, cast_id: str) -> bool:
        forget_allocated(artifact_root, cast_id)
        return discard_unsaved(artifact_root, cast_id)

    def try_lease(self, artifact_root: Path, cast_id: str, *, root_resolved: bool = False,
                  fresh: bool = False) -> CastLease | None:
        return CastLease.try_acquire(artifact_root, cast_id, root_resolved=root_resolved, fresh=fresh)

    def lease_held(self, artifact_root: Path, cast_id: str) -> bool:
        return CastLease.is_held(artifact_root, cast_id)

    def watch_abort_requests(self, run_dir: Path, since: float, on_asked: Callable[[], None],
                             warn: Callable[[str], None]) -> Callable[[], None]:
        return abort_requests.watch(run_dir, since, on_asked, warn)

    def list_page(self, artifact_root: Path, *, limit: int | None = DEFAULT_PAGE,
                  cursor: str | None = None) -> CastPage:
        return list_page(artifact_root, limit=limit, cursor=cursor)

    def newest(self, artifact_root: Path, where: str) -> Iterator[CastSummary]:
        return newest(artifact_root, where)

    def write_json(self, path: Path, value: Any) -> None:
        fs.atomic_write_json(path, value, mode=fs.PRIVATE_FILE_MODE)  # a run directory's file

    def note_in_cli_json(self, run_dir: Path, key: str, value: list[str] | None) -> bool:
        note = run_dir / "cli.json"
        try:
            recorded = json.loads(fs.read_regular_file(note, 64 * 1024, follow_links=False))
        except FileNotFoundError:
            recorded = {}
        except (OSError, ValueError, RecursionError):
            return False
        if not isinstance(recorded, dict) or recorded.get(key) == value:
            return False
        if value is None:
            recorded.pop(key)
        else:
            recorded[key] = value
        fs.atomic_write_json(note, recorded, mode=fs.PRIVATE_FILE_MODE)
        return True

    def kill_recorded(self, run_dir: Path, cast_id: str, *, keep: str | None = None) -> list[int]:
        return command_records.kill_recorded(run_dir, cast_id, keep=keep)

    def cluster_fence_s(self, run_dir: Path, cast_id: str) -> float:
        return command_records.cluster_fence_s(run_dir, cast_id)

    def finished_command(self, run_dir: Path, cast_id: str, visit_id: str) -> dict[str, Any] | None:
        return command_records.finished_outcome(run_dir, cast_id, visit_id)

    def interrupted_command(self, run_dir: Path, cast_id: str, visit_id: str) -> bool:
        return command_records.started_without_outcome(run_dir, cast_id, visit_id)

    def forget_command(self, run_dir: Path, visit_id: str) -> None:
        command_records.forget(command_records.record_path(run_dir, visit_id))

    def config_cache(self) -> config_loader.ResolvedConfigCache:
        """One cache for every session over this storage (a runtime's): sessions in one project
        share its resolved config, and what each cast derives from it once (its JSON texts), instead
        of a copy each. Keyed by project, loadout and config file, checked against the layer files."""
        cache: config_loader.ResolvedConfigCache | None = self.__dict__.get("_config_cache")
        if cache is None:
            cache = self.__dict__.setdefault("_config_cache", config_loader.ResolvedConfigCache())
        assert cache is not None
        return cache

    def load_config(self, cwd: str | os.PathLike[str], *,
                    config_path: str | os.PathLike[str] | None = None) -> LoadedConfig:
        return config_loader.load(cwd, config_path=config_path)

    def save_active_loadout(self, cwd: str | os.PathLike[str], name: str, *,
                            config_path: str | os.PathLike[str] | None = None) -> Path:
        return config_loader.save_active_loadout(cwd, name, config_path=config_path)

    def confine(self, root: str | os.PathLike[str], value: str, *, allow_absolute: bool = False) -> Path:
        return fs.confine(root, value, allow_absolute=allow_absolute)

    def validate_config_file(self, path: str | os.PathLike[str], *,
                             project: str | os.PathLike[str] | None = None,
                             config_path: str | os.PathLike[str] | None = None) -> list[ConfigIssue]:
        return config_loader.validate_file(path, project=project, config_path=config_path)


FILE_CAST_STORAGE: CastStorage = FileCastStorage()
"""The file-system cast storage (stateless: one instance serves every runtime)."""

__all__ = ["FILE_CAST_STORAGE", "FileCastStorage"]
