"""``built``: an effect made without validation is the instance validation makes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from castor.domain.materia.cast_messages import EmitEvent, RunAgentTurn, RunUtility, WriteArtifact, built
from castor.domain.materia.state import Pending

from .conftest import checked_built


def test_a_built_effect_equals_the_validated_one_and_stays_frozen() -> None:
    event = checked_built(EmitEvent, type="socket_start", data={"socket": "A"}, ts_ms=5)
    checked_built(WriteArtifact, path=("contexts", "A-1.md"), content="text", manifest=None)
    checked_built(WriteArtifact, path=("usage.json",), content="{}")
    checked_built(Pending, kind="agent_turn", visit_id="c:A:1:1", socket_id="A", visit=1, mode="normal",
                  user_driven=False)
    checked_built(RunAgentTurn, visit_id="c:A:1:1", socket_id="A", visit=1, materia="m", mode="normal",
                  prompt="p", system_prompt="", visible_summary="s", tools="none")
    with pytest.raises(ValidationError):
        event.type = "other"  # type: ignore[misc]


def test_a_model_with_a_default_factory_is_refused() -> None:
    with pytest.raises(TypeError, match="default_factory"):
        built(RunUtility, visit_id="v", socket_id="A", visit=1, stdin_json={}, timeout_ms=1, max_output_bytes=1)
