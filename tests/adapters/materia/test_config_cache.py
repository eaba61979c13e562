"""ResolvedConfigCache: a cast start re-reads the config layers only when one of them changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from castor.adapters.materia.config_loader import ResolvedConfigCache
from castor.domain.materia.config import ConfigError


def _project(cwd: Path, active: str, **extra: object) -> None:
    (cwd / ".pi").mkdir(parents=True, exist_ok=True)
    (cwd / ".pi" / "pi-materia.json").write_text(json.dumps({"activeLoadout": active, **extra}))


def test_same_files_same_object_and_every_kind_of_change_is_seen(tmp_path):
    cwd, profile = tmp_path / "proj", tmp_path / "profile"
    env = {"PI_MATERIA_PROFILE_DIR": str(profile)}
    _project(cwd, "hello")
    cache = ResolvedConfigCache()
    first = cache.load_resolved(cwd, env=env)
    assert cache.load_resolved(cwd, env=env) is first and first.pipeline.loadout_name == "hello"
    _project(cwd, "plan")  # rewritten in place
    changed = cache.load_resolved(cwd, env=env)
    assert changed is not first and changed.pipeline.loadout_name == "plan"
    profile.mkdir()
    (profile / "materia.json").write_text(json.dumps({"artifactDir": ".pi/elsewhere"}))  # a layer appears
    with_profile = cache.load_resolved(cwd, env=env)
    assert with_profile is not changed and with_profile.artifact_dir == ".pi/elsewhere"
    os.unlink(cwd / ".pi" / "pi-materia.json")  # a layer disappears
    assert cache.load_resolved(cwd, env=env).pipeline.loadout_name != "plan"
    assert cache.load_resolved(cwd, loadout="plan", env=env).pipeline.loadout_name == "plan"


def test_failures_are_not_cached(tmp_path):
    cwd = tmp_path / "proj"
    env = {"PI_MATERIA_PROFILE_DIR": str(tmp_path / "none")}
    (cwd / ".pi").mkdir(parents=True)
    (cwd / ".pi" / "pi-materia.json").write_text("{broken")
    cache = ResolvedConfigCache()
    for _ in range(2):
        with pytest.raises(ConfigError):
            cache.load_resolved(cwd, env=env)
    _project(cwd, "hello")
    assert cache.load_resolved(cwd, env=env).pipeline.loadout_name == "hello"
