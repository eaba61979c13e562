"""The file and process implementation of the Icarus backend port.

:class:`FileIcarusBackend` reads and writes Icarus settings files (``settings_store``) and
starts worker subprocesses (``launch`` + ``worker_process``); it is what
:mod:`castor.composition` gives the Icarus component unless told otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from castor.adapters.fs import file_signature, storage_unavailable
from castor.adapters.icarus.launch import build_launch
from castor.adapters.icarus.settings_store import load_layers, load_settings, update_settings
from castor.adapters.icarus.worker_process import next_request_id, worker_factory
from castor.domain.icarus.settings import IcarusSettings, SettingsLayer
from castor.ports.icarus_backend import IcarusBackend, WorkerProcessPort


class FileIcarusBackend:
    """Settings from files, workers as subprocesses.

    ``env`` (default: this process's environment, read at each call) feeds settings resolution
    and the worker's parent environment; ``home`` (default: the user's) locates the global settings.
    """

    def __init__(self, *, env: Mapping[str, str] | None = None, home: str | None = None) -> None:
        self._given_env = env
        self._home = home

    def _env(self) -> dict[str, str]:
        return dict(os.environ if self._given_env is None else self._given_env)

    def load_settings(self, cwd: str, *, trusted: bool) -> IcarusSettings:
        return load_settings(cwd, trusted=trusted, env=self._env(), home=self._home)

    def settings_signature(self, path: str) -> tuple[int, ...] | None:
        return file_signature(path)

    def settings_layers(self, cwd: str, *, trusted: bool) -> tuple[SettingsLayer, SettingsLayer]:
        return load_layers(cwd, trusted=trusted, env=self._env(), home=self._home)

    def update_settings(self, path: str, mutate: Callable[[dict[str, Any]], dict[str, Any]], *,
                        confine_to: str | None = None, owned: bool = False) -> dict[str, Any]:
        try:
            return update_settings(path, mutate, confine_to=confine_to, owned=owned)
        except OSError as exc:  # the disk refused the write (full, read-only): the storage's, not castor's bug
            raise storage_unavailable(exc, path=path, base=confine_to, action="save the settings") from None

    def package_present(self, icarus_dir: str) -> bool:
        return os.path.isfile(os.path.join(icarus_dir, "__init__.py"))

    def worker_spawn(self, settings: IcarusSettings, cwd: str) -> Callable[[], WorkerProcessPort]:
        return worker_factory(build_launch(settings, cwd=cwd, parent_env=self._env(), home=self._home))

    #: The process-wide counter's own ``__next__`` (see worker_process.next_request_id): a request
    #: id is one C call, not this method's frame around a function's.
    next_request_id = staticmethod(next_request_id)


def default_backend(*, env: Mapping[str, str] | None = None, home: str | None = None) -> IcarusBackend:
    """The file/process backend (see :class:`FileIcarusBackend`)."""
    return FileIcarusBackend(env=env, home=home)


__all__ = ["FileIcarusBackend", "default_backend"]
