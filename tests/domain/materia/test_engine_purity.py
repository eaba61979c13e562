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


def test_every_cast_starts_from_the_one_empty_usage_report_and_never_changes_it() -> None:
    # A new cast's report is one object shared by every cast (its usage.json text is rendered once
    # per process): a cast that counts turns and model selections must leave it empty.
    from castor.domain.materia.budget import UsageReport
    from castor.domain.materia.engine import _NO_USAGE

    empty = UsageReport().model_dump()
    cfg = resolved(config({"Socket-1": {"type": "agent", "materia": "A",
                                        "edges": [{"when": "always", "to": "Socket-2"}]},
                           "Socket-2": {"type": "agent", "materia": "A"}}))
    first = Driver(cfg, cast_id="cast-1")
    first.reply("one", usage={"input": 10, "output": 5, "cost": {"total": 0.5}})
    first.reply("two", usage={"input": 1, "output": 1})
    assert first.state.usage.turns and first.state.usage.tokens.total > 0
    assert _NO_USAGE.model_dump() == empty
    second = Driver(cfg, cast_id="cast-2")
    assert second.state.usage.turns == []
