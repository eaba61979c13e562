"""The Icarus session component: one memory bridge per harness session.

``icarus_component()`` is the :class:`~castor.runtime.SessionComponent` the
runtime loads by default. For every session it resolves the effective
settings from the session's cwd (a project layer only when the harness said
the project is trusted, so an untrusted checkout never chooses the Python
executable or the package) and, when the configured ``icarusDir`` holds a
package, starts::

    /root/session/<sid>/icarus              supervisor (one_for_one)
    /root/session/<sid>/icarus/worker       IcarusWorkerActor (lazy process; retires on timeout)
    /root/session/<sid>/icarus/classifier   ClassifierActor   (only when filtering)
    /root/session/<sid>/icarus/audit        AuditActor        (only when filtering)
    /root/session/<sid>/icarus/hooks        HookController

and keeps an :class:`~castor.actors.icarus.session.IcarusSession` facade in ``SessionContext.extras["icarus"]``
for the endpoint methods (``icarus.tool``, ``icarus.command``,
``icarus.config``, ``ops.worker``).

What the facade does with each harness event, and what it guarantees, is
documented in :mod:`castor.actors.icarus.session`.

Layering: actors do not import adapters. Files and processes are reached
through :class:`IcarusBackend`; ``icarus_component()`` called without one
builds the default (file settings store + worker subprocess) by importing the
adapters lazily -- the runtime calls it without arguments, so that import is
this module's composition seam.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loguru import logger

from castor.actors.icarus.session import COMPONENT, EXTRAS_KEY, IcarusBackend, IcarusSession
from castor.actors.icarus.worker import WorkerProcessPort
from castor.domain.icarus.settings import IcarusSettings, SettingsLayer
from castor.messages.errors import NotFound
from castor.supervision import ChildSpec

if TYPE_CHECKING:
    from castor.runtime import SessionComponent, SessionContext


def default_backend(*, env: Mapping[str, str] | None = None, home: str | None = None) -> IcarusBackend:
    """The file/process backend (adapters imported here, lazily: the composition seam)."""
    from castor.adapters.icarus.launch import build_launch
    from castor.adapters.icarus.settings_store import load_layers, load_settings, update_settings
    from castor.adapters.icarus.worker_process import next_request_id, worker_factory

    class _FileBackend:
        def _env(self) -> dict[str, str]:
            return dict(os.environ if env is None else env)

        def load_settings(self, cwd: str, *, trusted: bool) -> IcarusSettings:
            return load_settings(cwd, trusted=trusted, env=self._env(), home=home)

        def settings_layers(self, cwd: str, *, trusted: bool) -> tuple[SettingsLayer, SettingsLayer]:
            return load_layers(cwd, trusted=trusted, env=self._env(), home=home)

        def update_settings(self, path: str, mutate: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
            return update_settings(path, mutate)

        def package_present(self, icarus_dir: str) -> bool:
            return os.path.isfile(os.path.join(icarus_dir, "__init__.py"))

        def worker_spawn(self, settings: IcarusSettings, cwd: str) -> Callable[[], WorkerProcessPort]:
            return worker_factory(build_launch(settings, cwd=cwd, parent_env=self._env(), home=home))

        def next_request_id(self) -> int:
            return next_request_id()

    return _FileBackend()


class _NoUi:
    """The harness has no UI: status and toasts go nowhere."""

    def send_message(self, custom_type: str, content: str, *, display: bool, trigger_turn: bool = False) -> None:
        pass

    def set_status(self, key: str, text: str | None) -> None:
        pass

    def notify(self, message: str, level: str = "info") -> None:
        pass


# ---------------------------------------------------------------------------
# The component


def _build_session(ctx: SessionContext, backend: IcarusBackend) -> IcarusSession:
    info = ctx.info
    settings = backend.load_settings(info.cwd, trusted=info.trusted)
    available = backend.package_present(settings.icarus_dir)
    filtering, filtering_reason = True, None
    if settings.classifier.strip().lower() == "none":
        filtering, filtering_reason = False, "classifier_none"
    elif ctx.harness.session_log is None:
        filtering, filtering_reason = False, "no_session_log"
    return IcarusSession(
        ctx=ctx, backend=backend, settings=settings, available=available,
        reason=None if available else "icarus_dir_missing",
        filtering=filtering and available, filtering_reason=filtering_reason if available else "icarus_unavailable",
        ui=ctx.harness.ui or _NoUi(),
    )


def session_of(ctx: SessionContext) -> IcarusSession:
    """The session's Icarus facade; ``NotFound`` when the component is not loaded."""
    sess = ctx.extras.get(EXTRAS_KEY)
    if not isinstance(sess, IcarusSession):
        raise NotFound("the icarus component is not loaded in this runtime",
                       data={"session_id": ctx.info.session_id, "reason": "no_icarus_component"})
    return sess


def icarus_component(backend: IcarusBackend | None = None, *, env: Mapping[str, str] | None = None,
                     home: str | None = None) -> SessionComponent:
    """The Icarus session component (see the module docstring).

    ``env``/``home`` feed the default backend: settings resolution (global
    settings path, backend env overrides) and the worker's parent environment.
    """
    from castor.runtime import SessionComponent

    chosen = backend if backend is not None else default_backend(env=env, home=home)

    def children(ctx: SessionContext) -> list[ChildSpec]:
        sess = _build_session(ctx, chosen)
        ctx.extras[EXTRAS_KEY] = sess
        if not sess.available:
            logger.bind(actor=sess.path(), reason=sess.reason).debug("icarus unavailable for this session")
        return sess.children()

    def on_event(ctx: SessionContext, event: str, data: dict[str, Any]) -> dict[str, Any] | None:
        sess = ctx.extras.get(EXTRAS_KEY)
        return sess.event(event, data) if isinstance(sess, IcarusSession) else None

    def on_close(ctx: SessionContext) -> None:
        sess = ctx.extras.get(EXTRAS_KEY)
        if isinstance(sess, IcarusSession):
            sess.close()

    return SessionComponent(name=COMPONENT, children=children, on_event=on_event, on_close=on_close)


__all__ = ["COMPONENT", "default_backend", "icarus_component", "session_of"]
