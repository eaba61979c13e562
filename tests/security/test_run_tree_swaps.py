"""The readers ``castor status``, ``castor casts`` and the console share, with a run directory
swapped for a link at the worst moment: after castor checked the path, before it opened the file.

``CastStateStore.load`` checked the path component by component (``lstat``) and then opened it by
name, and the listing's rebuild opened ``<root>/<id>/state.json`` with ``O_NOFOLLOW`` on the last
component alone: a run directory swapped for a link in between was read through, and the cast
shown was whatever the link's directory held. Both now open the path a component at a time with
directory descriptors, no link followed: the swap is refused, nothing behind it is read.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from castor.adapters.materia import state_store
from castor.adapters.materia.state_store import CastStateStore, list_page
from castor.messages.errors import Forbidden

SECRET = "SECRET-behind-the-swap-41c2"
CAST = "2026-01-01T00-00-00-000Z"


def _saved(root: Path, request: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    store = CastStateStore(root)
    store.save(CAST, {"version": 2, "active": False, "phase": "failed", "failedReason": "boom",
                      "request": request, "updatedAt": time.time()}, incarnation=store.claim(CAST))


def _swap(run_dir: Path, target: Path) -> None:
    """``run_dir`` moved aside and a link to ``target`` put in its place (what another user who may
    write in the run tree can do at any moment)."""
    os.rename(run_dir, run_dir.with_name(run_dir.name + ".moved"))
    run_dir.symlink_to(target, target_is_directory=True)


@pytest.fixture
def project_and_elsewhere(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "project" / ".pi" / "pi-materia"
    _saved(root, "the project's own request")
    elsewhere = tmp_path / "elsewhere"
    _saved(elsewhere, SECRET)
    return root, elsewhere


def test_a_run_directory_swapped_between_the_check_and_the_read_is_refused_by_status_s_load(
        project_and_elsewhere, monkeypatch):
    root, elsewhere = project_and_elsewhere
    store = CastStateStore(root)
    checked = CastStateStore.state_path

    def check_then_swap(self: CastStateStore, cast_id: str) -> Path:
        path = checked(self, cast_id)  # the containment walk passed: the run directory is a directory
        _swap(root / CAST, elsewhere / CAST)
        return path

    monkeypatch.setattr(CastStateStore, "state_path", check_then_swap)
    with pytest.raises(Forbidden) as refused:
        store.load(CAST)
    assert "symbolic link" in refused.value.message and SECRET not in refused.value.message
    assert refused.value.data["path"] == str(root / CAST)


def test_a_run_directory_swapped_between_the_listing_and_the_read_is_unreadable_in_castor_casts(
        project_and_elsewhere, monkeypatch):
    """The listing's rebuild (no cast index yet: the first ``castor casts`` of a project, or the
    console's cast list) reads each directory it listed; one swapped for a link meanwhile is
    listed unreadable, as a link in a run directory's place, never as the cast behind it."""
    root, elsewhere = project_and_elsewhere
    listed = state_store._cast_dir_names

    def list_then_swap(where: str) -> list[str] | None:
        names = listed(where)
        if os.path.isdir(root / CAST) and not os.path.islink(root / CAST):
            _swap(root / CAST, elsewhere / CAST)
        return names

    monkeypatch.setattr(state_store, "_cast_dir_names", list_then_swap)
    monkeypatch.setattr(state_store.cast_index, "open_index", lambda *a, **k: None)  # the rebuild's own read
    page = list_page(root)
    assert [c.cast_id for c in page.casts] == [], page.casts
    assert [p.cast_id for p in page.problems] == [CAST]
    assert "a symbolic link is in place of its run directory" in page.problems[0].reason
    assert SECRET not in repr(page)
