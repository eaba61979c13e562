"""The runtime confines a configured artifactDir to the project."""

from __future__ import annotations

import pytest

from castor.messages.errors import Forbidden
from castor.runtime import Runtime, RuntimeSettings

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def runtime():
    rt = Runtime(components=[])
    yield rt
    rt.shutdown(10)


@pytest.mark.parametrize("hostile", ["../elsewhere", "/etc", "a/../../b", "/tmp"])
def test_a_configured_artifact_dir_outside_the_project_is_forbidden(runtime, tmp_path, hostile):
    with pytest.raises(Forbidden):
        runtime.artifact_root_for(str(tmp_path), hostile)


def test_relative_and_default_artifact_dirs_resolve_inside_the_project(runtime, tmp_path):
    assert runtime.artifact_root_for(str(tmp_path), None) == (tmp_path / ".pi/pi-materia").resolve()
    assert runtime.artifact_root_for(str(tmp_path), "out/casts") == (tmp_path / "out/casts").resolve()


def test_the_runtime_override_wins(tmp_path):
    rt = Runtime(RuntimeSettings(artifact_root=str(tmp_path / "override")), components=[])
    try:
        assert rt.artifact_root_for("/anywhere", "../x") == (tmp_path / "override").resolve()
    finally:
        rt.shutdown(10)


def test_a_session_cwd_that_is_not_an_existing_directory_is_not_found(tmp_path):
    from castor.adapters.fs import check_project_dir
    from castor.messages.errors import NotFound

    with pytest.raises(NotFound):
        check_project_dir(str(tmp_path / "missing"))
    check_project_dir(str(tmp_path))
