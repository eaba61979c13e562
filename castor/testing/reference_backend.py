"""Where the reference Icarus backend the demo and the soak drive is found: the source checkout's
``examples/icarus_reference/icarus`` (or an editable install's), else the copy a wheel installs as
data under ``<sys.prefix>/share/castor/icarus_reference/icarus``. It checks that the chosen
directory holds the package's ``__init__.py`` only to choose; it does not import it."""

from __future__ import annotations

import sys
from pathlib import Path

import castor

REFERENCE_BACKEND_DATA = ("share", "castor", "icarus_reference", "icarus")
"""Where a wheel installs the reference backend, under the environment's prefix (pyproject's
``[tool.setuptools.data-files]``)."""


def reference_backend() -> Path:
    """The reference backend: ``examples/icarus_reference/icarus`` of a source checkout (or an
    editable install), else the copy a wheel installed under ``<sys.prefix>/share/castor/``."""
    checkout = Path(castor.__file__).resolve().parents[1] / "examples" / "icarus_reference" / "icarus"
    installed = Path(sys.prefix).joinpath(*REFERENCE_BACKEND_DATA)
    if not (checkout / "__init__.py").is_file() and (installed / "__init__.py").is_file():
        return installed
    return checkout
