"""PROBE castor for tests: the real castor endpoint (Dispatcher + Connection on stdio)
with scripted test handlers instead of the actors.

It checks the Pi extension's side of the contract before the real methods are wired:
every call it receives is appended to ``$CASTOR_PROBE_LOG`` (JSONL ``{method, params}``),
and prompts starting with ``PROBE`` make it act through the harness methods:

| prompt                | what the probe does                                                        |
|-----------------------|----------------------------------------------------------------------------|
| ``PROBE inject <x>``  | before_agent_start returns a hidden message ``PROBE-CONTEXT <x>`` and a     |
|                       | system prompt addendum ``PROBE-SYS``                                       |
| ``PROBE audit``       | calls ``session.append_entry`` (``probe-audit``) *before* answering         |
| ``PROBE expiry``      | calls ``session.append_entry`` (``probe-expired``) with an ``expires_at_ms``  |
|                       | already past, then (``probe-in-time``) with one 5 s ahead; logs ``expiry``  |
|                       | with the error code and data of each (or the ack)                          |
| ``PROBE notify``      | notifies ``ui.notify`` and ``ui.status``                                    |
| ``PROBE turn <x>``    | after agent_settled, sends ``agent.run_turn`` with hidden prompt ``TURN: <x>``     |
| ``PROBE models``      | calls ``model.list`` and ``classifier.complete``, logs the answers          |
| ``PROBE busyturn <x>``| sends ``agent.run_turn`` (``TURN: <x>``) 0.3 s into that prompt's own run    |
| ``PROBE slow <s>``    | answers before_agent_start after ``<s>`` seconds (a slow memory retrieval),   |
|                       | with a hidden message ``PROBE-LATE``; logs ``slow_answered`` when it does    |

``cast.abort`` answers at once and, while a probe turn runs (sent, no ``agent.turn_ended`` yet),
sends ``agent.abort_turn`` for it first (``$CASTOR_PROBE_ABORT_TWICE=1``: twice). ``agent.turn_ended``
for a turn it aborted answers ``{ok: true, ignored: true}`` (castor's contract for a late end);
``$CASTOR_PROBE_HOLD_TURN_END=S`` holds a turn's end up to S seconds (until an abort) and then
answers ``not_found`` for an aborted one, as a castor without that contract would.

``$CASTOR_PROBE_SLOW_TURN_START=S`` answers a castor turn's own ``before_agent_start`` (message type
``custom``) after S seconds.

``$CASTOR_PROBE_SLOW_CONTEXT=S`` answers each ``context`` event after S seconds (a slow context
filter: castor's Icarus hooks may ask a classifier there); logs ``slow_context_answered``.

``$CASTOR_PROBE_SLOW_CAST_START=S``: ``cast.start`` takes S seconds, then asks for a turn
(``TURN: cast``) and answers, as castor does for a cast's entry socket (a slow config load).

``$CASTOR_PROBE_NEXT_TURN_AFTER=S``: S seconds after a probe turn's answered ``agent.turn_ended`` (the
first one only), sends the next turn, ``agent.run_turn`` (``TURN: next``), as a cast's next socket is asked for.

``$CASTOR_PROBE_TURN_AT_SHUTDOWN=<x>`` sends ``agent.run_turn`` (``TURN: <x>``) as ``session_shutdown``
arrives and answers that event 0.5 s later (a socket's turn asked for as Pi replaces or ends the session).

``icarus.config`` announces the tool ``probe_echo`` (``icarus.tool`` echoes ``text``;
``text == "bad"`` returns ``{error: ...}``). Other methods answer ``{text: "probe <method>"}``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from castor.endpoint.connection import Connection
from castor.endpoint.dispatch import Context, Dispatcher
from castor.endpoint.transport import PipeTransport
from castor.messages.errors import CastorError, NotFound

LOG_LOCK = threading.Lock()
STATE: dict[str, Any] = {"pending_turn": None, "turns": 0, "running": None, "aborted": set(), "chained": False}


def record(method: str, params: Any) -> None:
    path = os.environ.get("CASTOR_PROBE_LOG")
    if not path:
        return
    with LOG_LOCK, open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"method": method, "params": params}, default=str) + "\n")


def harness_event(params: dict[str, Any], ctx: Context) -> dict[str, Any] | None:
    event, data = params.get("event"), params.get("data") or {}
    messages = data.get("messages") or []
    answers = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
    # what a memory capture would take as the run's answer (never a prompt's text)
    last_answer = {"text": answers[-1].get("text"), "stop_reason": answers[-1].get("stop_reason")} if answers else None
    record("harness.event", {"event": event, "data": {k: v for k, v in data.items() if k != "messages"},
                             "message_count": len(messages), "last_answer": last_answer})
    if event == "agent_settled" and STATE["pending_turn"]:
        prompt, STATE["pending_turn"] = STATE["pending_turn"], None
        STATE["turns"] += 1
        turn = {
            "session_id": params.get("session_id"),
            "turn_id": f"probe-{STATE['turns']}",
            "prompt": f"TURN: {prompt}",
            "summary": "probe turn",
            "isolate": True,
        }
        # Like an actor would: answer the event first, then ask for the turn.
        STATE["running"] = turn["turn_id"]
        threading.Timer(0.01, lambda: ctx.notify("agent.run_turn", turn)).start()
        return None
    if event == "session_shutdown" and os.environ.get("CASTOR_PROBE_TURN_AT_SHUTDOWN"):
        STATE["turns"] += 1
        turn = {"session_id": params.get("session_id"), "turn_id": f"probe-{STATE['turns']}",
                "prompt": f"TURN: {os.environ['CASTOR_PROBE_TURN_AT_SHUTDOWN']}", "isolate": True}
        ctx.notify("agent.run_turn", turn)
        time.sleep(0.5)
        return None
    if event == "context" and os.environ.get("CASTOR_PROBE_SLOW_CONTEXT"):
        time.sleep(float(os.environ["CASTOR_PROBE_SLOW_CONTEXT"]))
        record("slow_context_answered", {"turn_id": data.get("turn_id")})
        return None
    if event != "before_agent_start":
        return None
    if data.get("message_type") == "custom" and os.environ.get("CASTOR_PROBE_SLOW_TURN_START"):
        # castor slow to answer a castor turn's own before_agent_start (a busy runtime)
        time.sleep(float(os.environ["CASTOR_PROBE_SLOW_TURN_START"]))
        record("slow_turn_start_answered", {"turn_id": data.get("turn_id")})
        return None
    prompt = data.get("prompt") or ""
    if not prompt.startswith("PROBE "):
        return None
    verb, _, arg = prompt[len("PROBE "):].partition(" ")
    if verb == "inject":
        return {"message": {"custom_type": "probe-context", "content": f"PROBE-CONTEXT {arg}", "display": False},
                "system_prompt_append": "\n\nPROBE-SYS"}
    if verb == "audit":
        ack = ctx.call(
            "session.append_entry", {"custom_type": "probe-audit", "data": {"version": 1, "n": 1}}, timeout=5
        )
        record("ack", ack)
        return {"message": {"custom_type": "probe-context", "content": "PROBE-AUDITED", "display": False}}
    if verb == "expiry":
        for custom_type, ahead_ms in (("probe-expired", -1000), ("probe-in-time", 5000)):
            params = {"custom_type": custom_type, "data": {"version": 1},
                      "expires_at_ms": int(time.time() * 1000) + ahead_ms}
            try:
                record("expiry", {"custom_type": custom_type, "ack": ctx.call("session.append_entry", params,
                                                                              timeout=5)})
            except CastorError as exc:
                record("expiry", {"custom_type": custom_type, "code": str(exc.code), "data": exc.data})
        return None
    if verb == "notify":
        ctx.notify("ui.notify", {"message": "probe says hi", "level": "warning"})
        ctx.notify("ui.status", {"key": "probe", "text": "probe: on"})
    if verb == "turn":
        STATE["pending_turn"] = arg
    if verb == "slow":
        time.sleep(float(arg))
        record("slow_answered", {"after_s": float(arg)})
        return {"message": {"custom_type": "probe-context", "content": "PROBE-LATE", "display": False}}
    if verb == "busyturn":  # castor asks while Pi is busy: the extension sends a follow-up
        STATE["turns"] += 1
        turn = {"session_id": params.get("session_id"), "turn_id": f"probe-{STATE['turns']}", "prompt": f"TURN: {arg}",
                "isolate": True}
        STATE["running"] = turn["turn_id"]
        threading.Timer(0.3, lambda: ctx.notify("agent.run_turn", turn)).start()
    if verb == "models":
        record("model.list", ctx.call("model.list", {}, timeout=5))
        try:
            record("classifier.complete", ctx.call("classifier.complete", {
                "provider": "fake", "model": "fake-model", "system": "classify", "prompt": "CLASSIFY ME",
                "max_tokens": 50, "timeout_ms": 5000}, timeout=10))
        except Exception as exc:  # noqa: BLE001 - the test asserts on the logged error
            record("classifier.complete", {"error": str(exc), "code": getattr(exc, "code", None)})
    return None


def icarus_tool(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    record("icarus.tool", params)
    text = (params.get("params") or {}).get("text")
    if text == "bad":
        return {"error": "probe refused bad"}
    return {"echo": text}


def cast_abort(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    record("cast.abort", params)
    running, STATE["running"] = STATE["running"], None
    if running:
        STATE["aborted"].add(running)
        for _ in range(2 if os.environ.get("CASTOR_PROBE_ABORT_TWICE") else 1):
            ctx.notify("agent.abort_turn", {"session_id": params.get("session_id"), "turn_id": running,
                                            "reason": "user"})
    return {"text": f"probe cast.abort {running or 'no turn'}"}


def turn_ended(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    record("agent.turn_ended", params)
    hold = float(os.environ.get("CASTOR_PROBE_HOLD_TURN_END") or 0)
    if hold and params.get("turn_id") == STATE["running"]:
        # The turn is ending (Pi settled, its end is on the wire) and castor has not taken it yet:
        # the window a /materia abort can land in. Then answer as a castor without the late-end
        # contract would: not_found.
        record("turn_end_held", {"turn_id": params.get("turn_id")})
        deadline = time.monotonic() + hold
        while time.monotonic() < deadline and params.get("turn_id") not in STATE["aborted"]:
            time.sleep(0.01)
        if params.get("turn_id") in STATE["aborted"]:
            raise NotFound(f"no pending turn {params.get('turn_id')!r}")
    if params.get("turn_id") in STATE["aborted"]:
        return {"ok": True, "ignored": True}
    if STATE["running"] == params.get("turn_id"):
        STATE["running"] = None
    after = os.environ.get("CASTOR_PROBE_NEXT_TURN_AFTER")
    if after and not STATE["chained"] and not params.get("aborted"):
        STATE["chained"] = True
        STATE["turns"] += 1
        turn = {"session_id": params.get("session_id"), "turn_id": f"probe-{STATE['turns']}", "prompt": "TURN: next",
                "isolate": True}

        def next_turn() -> None:
            STATE["running"] = turn["turn_id"]
            record("next_turn_sent", {"turn_id": turn["turn_id"]})
            ctx.notify("agent.run_turn", turn)

        threading.Timer(float(after), next_turn).start()
    return {"ok": True}


def cast_start(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    record("cast.start", params)
    slow = os.environ.get("CASTOR_PROBE_SLOW_CAST_START")
    if not slow:
        return {"text": "probe cast.start"}
    time.sleep(float(slow))
    STATE["turns"] += 1
    turn = {"session_id": params.get("session_id"), "turn_id": f"probe-{STATE['turns']}", "prompt": "TURN: cast",
            "summary": "probe cast turn", "isolate": True}
    STATE["running"] = turn["turn_id"]
    ctx.notify("agent.run_turn", turn)  # asked for before the command's answer, as castor's entry socket is
    record("cast_start_answered", {"turn_id": turn["turn_id"]})
    return {"text": "probe cast started"}


def generic(method: str):
    def handler(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        record(method, params)
        if method == "icarus.config":
            return {"tools": [{"name": "probe_echo", "description": "Echo text back (probe)",
                               "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                                              "required": ["text"], "additionalProperties": True}}]}
        return {"text": f"probe {method} {json.dumps(params.get('args', ''))}".strip()}
    return handler


def build() -> Dispatcher:
    d = Dispatcher(name="castor-probe")
    d.register("harness.event", harness_event)
    d.register("icarus.tool", icarus_tool)
    d.register("cast.abort", cast_abort)
    d.register("cast.start", cast_start)
    d.register("agent.turn_ended", turn_ended)
    for method in ["session.open", "session.close", "icarus.config", "icarus.command",
                   "cast.status", "loadout.list"]:
        d.register(method, generic(method))
    return d


def main() -> None:
    # Keep the protocol on a private fd: anything printed by mistake goes to stderr.
    proto_out = os.dup(1)
    os.dup2(2, 1)
    conn = Connection(PipeTransport(0, proto_out, owns_fds=False, peer="stdio"), build()).start()
    conn.wait_closed()
    sys.exit(0)


if __name__ == "__main__":
    main()
