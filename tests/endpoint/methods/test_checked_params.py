"""``icarus.tool`` and ``harness.event`` check their params in the handler (no params model at
dispatch: castor.endpoint.methods.checked): every request is answered as the model answered it --
the same values reach the session, the same ``invalid_params`` (message and field details) for
anything the model refuses -- and the commonest params do not build the model."""

from __future__ import annotations

from typing import Any

import pytest

from castor.endpoint.dispatch import Context, Dispatcher
from castor.endpoint.methods import icarus as icarus_methods
from castor.endpoint.methods.icarus import ToolParams, register_icarus_methods
from castor.endpoint.methods.ownership import SESSIONS_KEY
from castor.endpoint.methods.session import HarnessEventParams, register_session_methods
from castor.messages.errors import CastorError

pytestmark = pytest.mark.timeout(30)


class _Link:
    superseded = False


class _Session:
    def __init__(self, seen: list[Any]) -> None:
        self.seen = seen

    def tool(self, name: str, params: Any, *, tool_call_id: str | None = None) -> Any:
        self.seen.append(("tool", name, params, tool_call_id))
        return {"query": "q"}


class _Runtime:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def dispatch_event(self, session_id: str, event: str, data: dict[str, Any], *,
                       answer: Any = None) -> dict[str, Any]:
        self.seen.append(("event", session_id, event, data))
        return {}


def _ctx(method: str) -> Context:
    return Context(connection=None, state={SESSIONS_KEY: {"s1": _Link(), "s\ud800": _Link()}},  # type: ignore[arg-type]
                   method=method, msgid=1)


def _outcome(dispatcher: Dispatcher, method: str, params: Any) -> Any:
    try:
        return ("ok", dispatcher.dispatch(method, params, _ctx(method)))
    except CastorError as exc:
        return ("error", exc.code, exc.message, exc.data)


EVENTS = [
    {"session_id": "s1", "event": "before_agent_start", "data": {"prompt": "hi", "images": 0}},
    {"session_id": "s1", "event": "session_start"},
    {"session_id": "s1", "event": "context", "data": {}},
    {"session_id": "s\ud800", "event": "turn_end", "data": {"x": [1, {"y": None}]}},
    {"session_id": "s1", "event": "before_agent_start", "data": None},
    {"session_id": "s1", "event": "no_such_event", "data": {}},
    {"session_id": "s1", "event": "before_agent_start", "data": {1: "x"}},
    {"session_id": "s1", "event": "before_agent_start", "data": [1]},
    {"session_id": "s1", "event": "before_agent_start", "data": {}, "extra": 1},
    {"session_id": 7, "event": "before_agent_start"},
    {"session_id": b"s1", "event": "before_agent_start"},
    {"event": "before_agent_start"},
    {"session_id": "s1"},
    {"session_id": "s1", "event": None},
    {},
    [],
    None,
    "s1",
]

TOOLS = [
    {"session_id": "s1", "name": "fabric_recall", "params": {"query": "q"}, "tool_call_id": "t1"},
    {"session_id": "s1", "name": "fabric_recall", "params": {"query": "q"}},
    {"session_id": "s1", "name": "fabric_recall", "params": None, "tool_call_id": None, "format": "result"},
    {"session_id": "s1", "name": "fabric_recall", "format": "value"},
    {"session_id": "s1", "name": "x" * 256},
    {"session_id": "s1", "name": "x" * 257},
    {"session_id": "s1", "name": "fabric_recall", "format": "other"},
    {"session_id": "s1", "name": "fabric_recall", "format": None},
    {"session_id": "s1", "name": "fabric_recall", "params": {2: "q"}},
    {"session_id": "s1", "name": "fabric_recall", "params": ["q"]},
    {"session_id": "s1", "name": "fabric_recall", "tool_call_id": 3},
    {"session_id": "s1", "name": 3},
    {"session_id": "s1", "name": "fabric_recall", "unknown": True},
    {"session_id": "s1"},
    {"name": "fabric_recall"},
    [],
    None,
]


def _reference(seen: list[Any], runtime: _Runtime) -> Dispatcher:
    """The methods as they were registered before: the params models validated at dispatch."""
    ref = Dispatcher(builtin_hello=False)

    def tool(p: ToolParams, _ctx: Context) -> Any:
        return _Session(seen).tool(p.name, p.params, tool_call_id=p.tool_call_id)

    def event(p: HarnessEventParams, _ctx: Context) -> Any:
        return runtime.dispatch_event(p.session_id, p.event, p.data)

    ref.register("icarus.tool", tool, ToolParams)
    ref.register("harness.event", event, HarnessEventParams)
    return ref


@pytest.mark.parametrize("params", EVENTS)
def test_harness_event_params_are_answered_as_the_model_answers_them(params: Any) -> None:
    runtime, ref_runtime = _Runtime(), _Runtime()
    dispatcher = Dispatcher(builtin_hello=False)
    register_session_methods(dispatcher, runtime)  # type: ignore[arg-type]
    got = _outcome(dispatcher, "harness.event", params)
    want = _outcome(_reference([], ref_runtime), "harness.event", params)
    assert got == want
    assert runtime.seen == ref_runtime.seen


@pytest.mark.parametrize("params", TOOLS)
def test_tool_params_are_answered_as_the_model_answers_them(params: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    ref_seen: list[Any] = []
    monkeypatch.setattr(icarus_methods, "_owned_session", lambda runtime, ctx, session_id: _Session(seen))
    dispatcher = Dispatcher(builtin_hello=False)
    register_icarus_methods(dispatcher, _Runtime())  # type: ignore[arg-type]
    got = _outcome(dispatcher, "icarus.tool", params)
    want = _outcome(_reference(ref_seen, _Runtime()), "icarus.tool", params)
    if got[0] == "ok" and isinstance(params, dict) and params.get("format") == "result":
        got = ("ok", {"query": "q"})  # the reference handler does not wrap a result
    assert got == want
    assert seen == ref_seen


def test_the_commonest_params_do_not_build_the_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """What takes the models' ~14k instructions out of every tool call and hook: they are not built
    for params of the commonest form."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the params model was built")

    monkeypatch.setattr(ToolParams, "model_validate", refuse)
    monkeypatch.setattr(HarnessEventParams, "model_validate", refuse)
    seen: list[Any] = []
    monkeypatch.setattr(icarus_methods, "_owned_session", lambda runtime, ctx, session_id: _Session(seen))
    runtime = _Runtime()
    dispatcher = Dispatcher(builtin_hello=False)
    register_session_methods(dispatcher, runtime)  # type: ignore[arg-type]
    register_icarus_methods(dispatcher, runtime)  # type: ignore[arg-type]
    dispatcher.dispatch("harness.event", EVENTS[0], _ctx("harness.event"))
    dispatcher.dispatch("icarus.tool", TOOLS[0], _ctx("icarus.tool"))
    assert runtime.seen == [("event", "s1", "before_agent_start", {"prompt": "hi", "images": 0})]
    assert seen == [("tool", "fabric_recall", {"query": "q"}, "t1")]
