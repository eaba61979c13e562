"""The worker call's hot path keeps the guarantees of the slow one it replaced."""

from __future__ import annotations

import pytest


def test_the_clients_fast_worker_call_is_the_validated_message():
    """``IcarusWorkerClient`` builds its ``WorkerCall`` without pydantic's validation: the result
    must be the very model validation gives (equal, same fields set, frozen)."""
    from pydantic import ValidationError

    from castor.actors.icarus.worker import CancelToken, WorkerCall, _worker_call

    token = CancelToken()
    fast = _worker_call("hooks", "echo", [1, "x"], {"k": [2]}, 12.5, token)
    slow = WorkerCall(module="hooks", function="echo", args=[1, "x"], kwargs={"k": [2]}, deadline=12.5, token=token)
    assert fast == slow and type(fast) is WorkerCall
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_dump() == slow.model_dump()
    with pytest.raises(ValidationError):
        fast.module = "tools"  # frozen like any message
