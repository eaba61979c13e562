"""A utility socket naming a built-in that does not exist loads (as in pi-materia) with an
``unknown-utility`` warning; ``castor validate`` called it valid and the cast failed on reaching it."""

from __future__ import annotations

from typing import Any

from castor.adapters.materia.builtins import BUILTIN_ALIASES
from castor.domain.materia.checks import KNOWN_UTILITIES
from castor.domain.materia.engine import IO_BUILTINS
from castor.domain.materia.resolve import load_config, resolve_config


def _cfg(socket: dict[str, Any]) -> dict[str, Any]:
    return {"activeLoadout": "L", "materia": {},
            "loadouts": {"L": {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "utility", **socket}}}}}


def test_a_misspelt_builtin_is_named_at_load_with_the_one_it_resembles() -> None:
    rc = resolve_config(load_config([("t.json", _cfg({"utility": "vcs.detekt", "parse": "json"}))]))
    ((code, path, message),) = [(w.code, w.path, w.message) for w in rc.warnings]
    assert (code, path) == ("unknown-utility", "/loadouts/L/sockets/Socket-1/utility")
    assert 'did you mean "vcs.detect"?' in message and "fails there" in message


def test_a_builtin_a_command_or_an_output_is_no_warning() -> None:
    for socket in ({"utility": name} for name in KNOWN_UTILITIES):
        assert not resolve_config(load_config([("t.json", _cfg(socket))])).warnings
    for socket in ({"utility": "mine", "command": ["true"]}, {"utility": "mine", "params": {"output": "x"}}):
        assert not resolve_config(load_config([("t.json", _cfg(socket))])).warnings


def test_the_known_utilities_are_the_ones_the_engine_and_the_runner_run() -> None:
    assert set(KNOWN_UTILITIES) == {"noop", "echo", *IO_BUILTINS} == set(BUILTIN_ALIASES)
