"""Huge numbers in a config: each is a typed issue at its own place in words about the number the
user wrote, never a crash at run time nor pydantic's words about a string."""

from __future__ import annotations

from typing import Any

import pytest

from castor.domain.materia.config import ConfigError
from castor.domain.materia.resolve import load_config, resolve_config


def _issues(cfg: dict[str, Any]) -> list[tuple[str, str, str]]:
    with pytest.raises(ConfigError) as err:
        resolve_config(load_config([("t.json", cfg)]))
    return [(i.code, i.path, i.message) for i in err.value.issues]


def _one_socket(socket: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"activeLoadout": "L", "materia": {"A": {"prompt": "p", "tools": "none"}}, **top,
            "loadouts": {"L": {"entry": "Socket-1", "sockets": {"Socket-1": socket}}}}


@pytest.mark.parametrize("timeout", [1e300, 2**31, 1e10])
def test_a_utility_timeout_no_timer_holds_is_refused_at_load(timeout: float) -> None:
    """``timeoutMs: 1e300`` loaded, and the utility slot running the command crashed on the wait
    (OverflowError), four times, before the cast failed with "utility slot crashed"."""
    socket = {"type": "utility", "command": ["true"], "timeoutMs": timeout}
    ((code, path, message),) = _issues(_one_socket(socket))
    assert (code, path) == ("invalid-socket", "/loadouts/L/sockets/Socket-1/timeoutMs")
    assert "at most 2147483647 ms" in message
    materia = _one_socket({"type": "utility", "utility": "noop"})
    materia["materia"]["U"] = {"type": "utility", "utility": "noop", "timeoutMs": timeout}
    assert [(c, p) for c, p, _ in _issues(materia)] == [("invalid-socket", "/materia/U/timeoutMs")]  # a materia's too


def test_the_longest_timer_still_loads() -> None:
    resolve_config(load_config([("t.json", _one_socket({"type": "utility", "command": ["true"],
                                                         "timeoutMs": 2**31 - 1}))]))


def test_a_limit_past_a_64_bit_integer_is_named_at_its_own_place_in_its_own_words() -> None:
    """``limits.maxSocketVisits: 1e300`` passed the limits check (a whole number) and was refused
    by the model as ``/maxSocketVisits`` -- no such place -- "Unable to parse input string as an
    integer, exceeded maximum size"."""
    cfg = _one_socket({"type": "agent", "materia": "A"}, limits={"maxSocketVisits": 1e300})
    ((code, path, message),) = _issues(cfg)
    assert (code, path) == ("invalid-limits", "/limits/maxSocketVisits") and "at most 9223372036854775807" in message
    cfg = _one_socket({"type": "agent", "materia": "A", "limits": {"maxVisits": 1e25},
                       "edges": [{"to": "end", "maxTraversals": 1e30}]})
    found = _issues(cfg)
    assert [(c, p) for c, p, _ in found] == [("invalid-socket", "/loadouts/L/sockets/Socket-1/edges/0/maxTraversals"),
                                            ("invalid-socket", "/loadouts/L/sockets/Socket-1/limits/maxVisits")]
    assert all("input string" not in m and "past the largest whole number" in m for _, _, m in found)
