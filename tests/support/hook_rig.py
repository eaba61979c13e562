"""A hook controller under a bare actor system, driven as a session drives it: a fake worker that
answers ``pre_llm_call`` with a context, a fake UI, the client a session holds -- for the tests of how
a prompt and its completion are stepped (with the session's prompt door, or without one: every
prompt an ask)."""

from __future__ import annotations

import itertools
import threading

from castor.actors.icarus.hook_controller import HookClient, HookController, PromptDoor
from castor.domain.icarus.lifecycle import HookConfig
from castor.supervision import ActorSystem, ChildSpec
from tests.support.icarus_fakes import FakeUi, FakeWorker

#: What a prompt answered with the fake worker's context returns.
MEMORY = {"message": {"customType": "icarus-memory-context", "content": "memory", "display": True}}
_ids = itertools.count(1)


class HookRig:
    """One controller and its client, a session ``S1`` started. ``door``: the session's prompt door
    (an idle controller's commonest prompt stepped without an ask); without it every prompt is an ask."""

    def __init__(self, system: ActorSystem, result: object = None, *, door: bool = False) -> None:
        self.ui = FakeUi()
        self.worker = FakeWorker({"pre_llm_call": {"context": "memory"} if result is None else result})
        self.door = PromptDoor() if door else None
        kwargs = {"door": self.door} if door else {}
        self.hooks = system.spawn(ChildSpec(id=f"hooks{next(_ids)}", factory=lambda: HookController(
            HookConfig(filtering=False), worker=self.worker, ui=self.ui, worker_timeout=5.0, **kwargs)))
        self.client = HookClient(self.hooks, default_timeout=10, **kwargs)
        self.client.event("session_start", {"session_id": "S1"})

    def controller(self) -> HookController:
        actor = self.hooks.actor
        assert isinstance(actor, HookController)
        return actor

    def prompts(self) -> int:
        """How many retrievals (``pre_llm_call``) the worker was asked for."""
        return self.worker.functions().count("pre_llm_call")

    def prompt_in_flight(self, *, helped: bool = True) -> tuple[threading.Thread, list, threading.Event]:
        """A prompt whose retrieval is held in the worker (``gate``): its thread, what reached its
        caller (``answers``: the early answer's calls, then what ``event`` returned)."""
        gate = self.worker.gates["pre_llm_call"] = threading.Event()
        answers: list = []
        early = answers.append if helped else None
        calls = len(self.worker.calls)
        thread = threading.Thread(target=lambda: answers.append(
            self.client.event("before_agent_start", {"prompt": "q"}, answer=early)), daemon=True)
        thread.start()
        assert self.worker.wait_calls(calls + 1)
        return thread, answers, gate
