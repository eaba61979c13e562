"""pi-materia's own files (its config fixtures), found at test time where the shared directory is:
``$CASTOR_SHARED_DIR/fixtures/pi-materia/``, ``<repo root>/../shared/...`` or, in a clone of a local
checkout, ``<that checkout>/../shared/...``; never copied into this repository."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _local_origin() -> Path | None:
    """The checkout this repository was cloned from, when that is a directory on this machine."""
    try:
        url = subprocess.run(["git", "-C", str(REPO), "config", "--get", "remote.origin.url"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = Path(url.removeprefix("file://")) if url else None
    return path.resolve() if path is not None and path.is_absolute() and path.is_dir() else None


def fixture_path(name: str) -> Path:
    """The fixture file, or fail (CI) / skip (elsewhere) when it is not there."""
    roots = [Path(os.environ["CASTOR_SHARED_DIR"])] if os.environ.get("CASTOR_SHARED_DIR") else []
    roots.append(REPO.parent / "shared")
    origin = _local_origin()
    if origin is not None and origin.parent / "shared" not in roots:
        roots.append(origin.parent / "shared")
    for root in roots:
        path = root / "fixtures" / "pi-materia" / name
        if path.is_file():
            return path
    message = (f"pi-materia fixture {name} not found under {', '.join(str(r) for r in roots)} "
               "(set CASTOR_SHARED_DIR to the shared directory)")
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(message)
    pytest.skip(message)
