"""The composition root gives the runtime its default components; the runtime alone has none."""

from __future__ import annotations

import pytest

from castor import composition
from castor.adapters.icarus.backend import FileIcarusBackend
from castor.ports.icarus_backend import IcarusBackend
from castor.runtime import Runtime, RuntimeSettings

pytestmark = pytest.mark.timeout(30)


def test_the_default_components_are_materia_then_icarus():
    assert [c.name for c in composition.default_components()] == ["materia", "icarus"]


def test_a_bare_runtime_builds_no_component_and_build_runtime_passes_the_defaults_in():
    bare = Runtime(RuntimeSettings())
    built = composition.build_runtime(RuntimeSettings())
    try:
        assert bare.components == []
        assert [c.name for c in built.components] == ["materia", "icarus"]
    finally:
        bare.shutdown(10)
        built.shutdown(10)


def test_the_file_backend_implements_the_icarus_backend_port():
    backend: IcarusBackend = FileIcarusBackend(env={}, home="/nonexistent-home")
    for name in ("load_settings", "settings_layers", "update_settings", "package_present", "worker_spawn",
                 "next_request_id"):
        assert callable(getattr(backend, name))
    assert backend.package_present("/nonexistent-dir") is False
