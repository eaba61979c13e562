"""Calls waiting behind a running Icarus worker call, as an operator sees them: ``ops.worker`` /
``ops.mailbox`` over a real server and client, and the tables ``castor inspect worker`` and
``castor inspect mailbox`` print from them. Before, a snapshot said only ``icarus.worker.call: 2``:
not which hook or tool waited, nor for how long. Now each waiting call names its target, how long
it has waited and its deadline -- and never its arguments (a prompt, a memory query)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from castor.client import Client
from castor.messages.errors import CastorError
from castor.messages.inspection import ActorSnapshot
from tests.support.icarus import serve_icarus_on_loopback
from tests.support.waiting import wait_for

TOKEN = "q" * 32


def _text(table) -> str:
    console = Console(width=400, record=True)
    console.print(table)
    return console.export_text()


@pytest.mark.timeout(60)
def test_calls_queued_behind_a_running_one_show_their_target_wait_and_deadline_never_their_arguments(world):
    from castor.console.terminal import mailbox_table, worker_table

    runtime = world.runtime()
    server = serve_icarus_on_loopback(runtime, TOKEN)
    client = Client.connect_tcp(*server.address, default_timeout=20, token=TOKEN)
    try:
        _ctx, sess = world.open(runtime)
        worker = sess.tool_worker()
        running = worker.submit("hooks", "sleep", kwargs={"seconds": 30}, timeout=40)
        path = sess.path("worker")
        handle = runtime.system.lookup(path)
        wait_for(lambda: (a := handle.snapshot().activity) and a.kind == "worker_call", 20, "the running call")
        queued = [
            worker.submit("hooks", "pre_llm_call", kwargs={"session_id": "s1", "is_first_turn": True,
                                                           "user_message": "PRIVATE-PROMPT-TEXT"}, timeout=40),
            worker.submit("tools", "fabric_search", [{"query": "PRIVATE-QUERY-TEXT"}], timeout=40),
        ]
        wait_for(lambda: handle.snapshot().mailbox.depth == 2, 20, "two calls queued behind it")

        stats = client.call("ops.worker", {"session_id": "s1"})["worker"]
        waiting = stats["actor"]["mailbox"]["queued"]
        assert [(q["message_type"], q["detail"]["target"], q["is_ask"]) for q in waiting] == [
            ("icarus.worker.call", "hooks.pre_llm_call", True), ("icarus.worker.call", "tools.fabric_search", True)]
        assert all(q["age_s"] >= 0 and 0 < q["detail"]["deadline_in_s"] <= 40 for q in waiting)
        assert waiting[0]["age_s"] >= waiting[1]["age_s"]  # oldest first
        mailbox = client.call("ops.mailbox", {"path": path})
        ActorSnapshot.model_validate(mailbox)  # the typed snapshot holds the same list
        shown = _text(worker_table({"runtime": {}, "worker": stats})) + _text(mailbox_table(mailbox))
        assert "hooks.pre_llm_call, waited" in shown and "tools.fabric_search, waited" in shown
        assert "deadline in" in shown
        everything = json.dumps(stats) + json.dumps(mailbox) + shown
        assert "PRIVATE" not in everything
    finally:
        worker.close()  # the running call is killed, the queued ones rejected: each answered
        for pending in (running, *queued):
            with pytest.raises(CastorError):
                pending.result()
        client.close()
        server.stop()
