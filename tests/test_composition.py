"""The composition root gives the runtime its default components; the runtime alone has none."""

from __future__ import annotations

import pytest

from castor import composition
from castor.adapters.icarus.backend import FileIcarusBackend
from castor.ports.icarus_backend import IcarusBackend
from castor.runtime import Runtime, RuntimeSettings

pytestmark = pytest.mark.timeout(30)


def test_the_default_components_are_materia_then_icarus():
    assert [c.name for c in composition.default_components()] == ["materia", "icarus"]


def test_a_bare_runtime_builds_no_component_and_build_runtime_passes_the_defaults_in():
    bare = Runtime(RuntimeSettings())
    built = composition.build_runtime(RuntimeSettings())
    try:
        assert bare.components == []
        assert [c.name for c in built.components] == ["materia", "icarus"]
    finally:
        bare.shutdown(10)
        built.shutdown(10)


def test_the_file_backend_implements_the_icarus_backend_port():
    backend: IcarusBackend = FileIcarusBackend(env={}, home="/nonexistent-home")
    for name in ("load_settings", "settings_layers", "update_settings", "package_present", "worker_spawn",
                 "next_request_id"):
        assert callable(getattr(backend, name))
    assert backend.package_present("/nonexistent-dir") is False


def test_an_early_answer_is_offered_to_the_last_listener_only_and_carries_the_parts_before_it(tmp_path):
    """dispatch_event(answer=) hands the answer to the last component with a listener when it
    answers early, merged over what the components before it answered; others never see it."""
    from castor.ports.session_component import SessionComponent
    from castor.runtime import HarnessLink, SessionInfo

    seen: dict[str, object] = {}

    def first(_ctx, _event, _data):
        return {"first": 1, "shared": "first"}

    def answering(name):
        def listener(_ctx, _event, _data, *, answer=None):
            seen[name] = answer
            if answer is not None:
                answer({"last": 2, "shared": "last"})
            return {"last": 2, "shared": "last"}
        return listener

    components = [SessionComponent(name="first", children=lambda _ctx: [], on_event=first),
                  SessionComponent(name="middle", children=lambda _ctx: [], on_event=answering("middle"),
                                   answers_early=True),
                  SessionComponent(name="last", children=lambda _ctx: [], on_event=answering("last"),
                                   answers_early=True)]
    rt = Runtime(RuntimeSettings(), components=components)
    try:
        rt.open_session(SessionInfo(session_id="s", cwd=str(tmp_path)),
                        HarnessLink(agent=None, session_log=None, ui=None))
        answered: list[dict] = []
        merged = rt.dispatch_event("s", "before_agent_start", {}, answer=answered.append)
        assert seen["middle"] is None and callable(seen["last"])
        assert answered == [{"first": 1, "shared": "last", "last": 2}]
        assert merged == {"first": 1, "shared": "last", "last": 2}  # the same reply, returned as ever
        assert rt.dispatch_event("s", "before_agent_start", {}) == merged and seen["last"] is None
    finally:
        rt.shutdown(10)
