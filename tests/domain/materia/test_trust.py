"""The materia trust rule (castor.domain.materia.trust), decided without threads or files."""

from __future__ import annotations

import pytest

from castor.domain.materia.config import LayerInfo
from castor.domain.materia.defaults import DEFAULT_LABEL, default_config
from castor.domain.materia.resolve import load_config, resolve_config
from castor.domain.materia.trust import check_project_trust, untrusted_commands
from castor.messages.errors import Forbidden

COMMAND_LOADOUT = {"activeLoadout": "cmd", "loadouts": {"cmd": {"entry": "Socket-1", "sockets": {
    "Socket-1": {"type": "utility", "command": ["true"], "parse": "json", "assign": {"got": "$"},
                 "edges": [{"when": "always", "to": "Socket-2"}]},
    "Socket-2": {"type": "agent", "materia": "greeter"}}}}}
AGENT_LOADOUT = {"activeLoadout": "talk", "loadouts": {"talk": {"entry": "Socket-1", "sockets": {
    "Socket-1": {"type": "agent", "materia": "greeter"}}}}}


def _resolved(config: dict, scope: str, *, loaded: bool = True):
    layers = [(DEFAULT_LABEL, default_config()), (scope, config)]
    info = [LayerInfo(scope="default", path=DEFAULT_LABEL, loaded=True),
            LayerInfo(scope=scope, path=f"/somewhere/{scope}.json", loaded=loaded)]
    return resolve_config(load_config(layers, layer_info=info))


def test_an_untrusted_project_layer_may_not_run_utility_commands():
    resolved = _resolved(COMMAND_LOADOUT, "project")
    assert untrusted_commands(resolved, trusted=False) == ["Socket-1"]
    with pytest.raises(Forbidden) as caught:
        check_project_trust(resolved, trusted=False)
    assert caught.value.data == {"reason": "untrusted_project", "sockets": ["Socket-1"]}


def test_a_trusted_session_may_run_the_projects_commands():
    resolved = _resolved(COMMAND_LOADOUT, "project")
    assert untrusted_commands(resolved, trusted=True) == []
    check_project_trust(resolved, trusted=True)


@pytest.mark.parametrize("scope", ["user", "explicit"])
def test_commands_from_the_users_own_or_an_explicit_layer_are_allowed_untrusted(scope):
    check_project_trust(_resolved(COMMAND_LOADOUT, scope), trusted=False)


def test_an_untrusted_project_without_commands_may_start():
    check_project_trust(_resolved(AGENT_LOADOUT, "project"), trusted=False)


def test_a_project_layer_that_was_not_loaded_does_not_count():
    check_project_trust(_resolved(COMMAND_LOADOUT, "project", loaded=False), trusted=False)
