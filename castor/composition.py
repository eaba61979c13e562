"""The composition root: the default session components with their adapters, put into a runtime.

:class:`castor.runtime.Runtime` builds no component itself. This module is where castor's two
systems meet their file and process implementations:

| component | its ports                              | the implementation passed in here |
|-----------|----------------------------------------|-----------------------------------|
| materia   | :class:`~castor.ports.cast_storage.CastStorage` | :data:`castor.adapters.materia.storage.FILE_CAST_STORAGE` |
| icarus    | :class:`~castor.ports.icarus_backend.IcarusBackend` | :class:`castor.adapters.icarus.backend.FileIcarusBackend` |

Callers that run castor (the endpoint server, the CLI, the demo and the soak, the scale-out
host) take their components from here; an embedder may do the same or hand ``Runtime`` its own.
"""  # noqa: E501 - table rows cannot wrap

from __future__ import annotations

from collections.abc import Mapping, Sequence

from castor.actors.icarus.component import icarus_component as _icarus_over
from castor.actors.materia.component import materia_component as _materia_component
from castor.adapters.icarus.backend import FileIcarusBackend
from castor.adapters.materia.storage import FILE_CAST_STORAGE
from castor.ports.cast_storage import CastStorage
from castor.ports.icarus_backend import IcarusBackend
from castor.ports.session_component import RuntimeSettings, SessionComponent
from castor.runtime import Runtime
from castor.supervision import ChildSpec


def materia_component(storage: CastStorage | None = None) -> SessionComponent:
    """The materia component (cast and socket supervisors and the session's SessionActor) over
    ``storage``; by default the file-system cast storage."""
    return _materia_component(storage if storage is not None else FILE_CAST_STORAGE)


def icarus_component(backend: IcarusBackend | None = None, *, env: Mapping[str, str] | None = None,
                     home: str | None = None) -> SessionComponent:
    """The Icarus component over ``backend``; by default the file/process backend, whose ``env``
    and ``home`` feed settings resolution (global settings path, backend env overrides) and the
    worker's parent environment."""
    return _icarus_over(backend if backend is not None else FileIcarusBackend(env=env, home=home))


def default_components() -> list[SessionComponent]:
    """The components every served runtime has unless told otherwise: materia, then icarus."""
    return [materia_component(), icarus_component()]


def build_runtime(settings: RuntimeSettings | None = None, *, components: Sequence[SessionComponent] | None = None,
                  extra_children: list[ChildSpec] | None = None, scaleout: object = None) -> Runtime:
    """A runtime with ``components`` (default: :func:`default_components`)."""
    chosen = default_components() if components is None else list(components)
    return Runtime(settings, components=chosen, extra_children=extra_children, scaleout=scaleout)


__all__ = ["build_runtime", "default_components", "icarus_component", "materia_component"]
