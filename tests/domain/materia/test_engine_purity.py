"""engine.step shares structure between states; these tests pin down that it stays pure.

(Every Driver-based test also asserts purity on each step: see ``scripted.Driver._apply``.)
"""

from __future__ import annotations

from castor.domain.materia.cast_messages import AbortRequested, RecastRequested
from castor.domain.materia.engine import step

from .scripted import Driver, config, resolved


def test_recast_does_not_touch_the_input_data_dict() -> None:
    # _start_socket pops stale loop keys from ``data`` in place: on the step's own copy only.
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A"}})))
    d.send(AbortRequested)
    failed = d.state.model_copy(update={"data": {"item": "stale", "keep": 1}, "active_turn_prompt": None})
    tr = step(failed, RecastRequested(at=99.0))
    assert failed.data == {"item": "stale", "keep": 1}
    assert tr.state.data == {"keep": 1}


def test_the_resolved_config_is_shared_not_copied() -> None:
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "A"}})))
    before = d.state
    d.reply("done")
    assert d.state.config is before.config  # held by reference: no per-step copy of the config
    assert d.state.visits is not before.visits
