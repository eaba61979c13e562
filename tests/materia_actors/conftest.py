from __future__ import annotations

import pytest

from .helpers import make_runtime


@pytest.fixture
def runtime_factory():
    made = []

    def make(**settings):
        rt = make_runtime(**settings)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.shutdown(10.0)


@pytest.fixture
def project(tmp_path):
    path = tmp_path / "project"
    path.mkdir()
    return path
