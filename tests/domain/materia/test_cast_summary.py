"""The visible "Casting **<materia> (<N>)**" line a turn shows the user, as pi-materia formats it:
the materia first with the socket's ordinal, a legacy " Socket-N" suffix of the materia's name
dropped, the names trimmed, and the current item's label on its own paragraph when there is one."""

from __future__ import annotations

import pytest

from .scripted import Driver, agent, config, resolved

pytestmark = pytest.mark.timeout(10)


def _summary(materia_name: str, socket_id: str = "Socket-3", data: dict[str, object] | None = None,
             **socket: object) -> str:
    cfg = resolved(config({socket_id: {"type": "agent", "materia": materia_name, **socket}},
                          materia={materia_name: agent("Plan {{request}}", "none")}))
    return Driver(cfg, data=data).pending().visible_summary


def test_the_materia_comes_first_with_the_sockets_ordinal() -> None:
    assert _summary("interactivePlan") == "Casting **interactivePlan (3)**"


def test_a_legacy_socket_suffix_of_the_materia_name_is_not_shown() -> None:
    assert _summary("interactivePlan Socket-3") == "Casting **interactivePlan (3)**"
    assert _summary("interactivePlan\tSocket-7") == "Casting **interactivePlan (3)**"  # any suffix, any spacing
    assert _summary("Socket-3") == "Casting **Socket-3 (3)**"  # nothing before it: the name stays
    assert _summary("  spaced  ") == "Casting **spaced (3)**"


def test_the_current_items_label_is_trimmed_and_a_blank_one_is_left_out() -> None:
    loop = {"foreach": {"items": "state.items", "as": "it", "cursor": "c"}}
    assert _summary("Build", data={"items": [{"id": "a", "title": "  Reduce prominence \n"}]},
                    **loop) == "Casting **Build (3)**\n\nReduce prominence"
    assert _summary("Build", data={"items": [{"id": "a", "title": "   "}]}, **loop) == "Casting **Build (3)**"
    assert _summary("Build", data={"items": [{"id": "a", "title": ""}]}, **loop) == "Casting **Build (3)**"
    assert _summary("Build", data={"items": [{"id": "a"}]}, **loop) == "Casting **Build (3)**\n\na"  # label = key
