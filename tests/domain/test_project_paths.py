"""The project-directory and artifactDir rules of castor.domain.paths (pure: no disk)."""

from __future__ import annotations

import pytest

from castor.domain import paths
from castor.messages.errors import Forbidden, InvalidParams

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("cwd", ["relative/dir", "", ".", "/abs\x00nul"])
def test_a_project_dir_must_be_an_absolute_path_without_nul(cwd):
    with pytest.raises(InvalidParams) as raised:
        paths.check_project_path(cwd)
    assert "\x00" not in raised.value.data["cwd"]


def test_an_absolute_project_path_passes_without_looking_at_the_disk():
    paths.check_project_path("/no/such/directory/anywhere")  # existence is the adapter's check


def test_an_artifact_dir_outside_the_project_is_forbidden_with_the_confinement_reason():
    refused = Forbidden("outside", data={"reason": paths.REASON_PARENT})
    error = paths.artifact_dir_outside("../elsewhere", "/project", refused)
    assert isinstance(error, Forbidden)
    assert error.data == {"artifactDir": "../elsewhere", "cwd": "/project", "reason": paths.REASON_PARENT}
