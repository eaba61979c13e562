"""The footer a prompt sets reaches the UI port when it says something new (hook_controller, "The
footer"): not again at every prompt, and again after anything that may have changed what the
harness shows -- another status, any ``session_start``, a failed UI call, a new incarnation."""

from __future__ import annotations

import itertools

from castor.actors.icarus.hook_controller import HookClient, HookController
from castor.domain.icarus.lifecycle import HookConfig
from castor.supervision import ActorSystem, ChildSpec
from tests.support.icarus_fakes import FakeUi, FakeWorker

FOOTER = ("icarus", "🪽 Icarus")
CLEARED = ("icarus", None)
_ids = itertools.count(1)


class Rig:
    def __init__(self, system: ActorSystem) -> None:
        self.ui = FakeUi()
        self.worker = FakeWorker({"pre_llm_call": {"context": "memory"}})
        self.hooks = system.spawn(ChildSpec(id=f"hooks{next(_ids)}", factory=lambda: HookController(
            HookConfig(filtering=False), worker=self.worker, ui=self.ui, worker_timeout=5.0)))
        self.client = HookClient(self.hooks, default_timeout=10)

    def prompt(self, text: str = "q") -> None:
        out = self.client.event("before_agent_start", {"prompt": text})
        assert out is not None and out["message"]["content"] == "memory"  # the hook itself is unchanged

    def sent(self) -> list[tuple[str, str | None]]:
        seen, self.ui.status = list(self.ui.status), []
        return seen


def test_a_prompt_sends_the_footer_only_when_the_last_prompt_did_not_send_the_same(system):
    rig = Rig(system)
    rig.client.event("session_start", {"session_id": "S1"})
    assert rig.sent() == [FOOTER]
    rig.prompt()  # the first prompt after the session's start sends it again
    assert rig.sent() == [FOOTER]
    for _ in range(3):
        rig.prompt()
    assert rig.sent() == []  # the harness shows it already
    rig.client.event("context", {})
    rig.client.event("before_agent_start", {"prompt": "   "})  # a blank prompt: footer, no retrieval
    assert rig.sent() == []


def test_every_session_start_makes_the_next_prompt_send_the_footer(system):
    rig = Rig(system)
    rig.client.event("session_start", {"session_id": "S1"})
    rig.prompt()
    rig.prompt()
    rig.sent()
    # The same session started again: the lifecycle answers it as a repeat and sends nothing, but the
    # harness may have been replaced or reset meanwhile: the next prompt sends the footer.
    rig.client.event("session_start", {"session_id": "S1"})
    assert rig.sent() == []
    rig.prompt()
    assert rig.sent() == [FOOTER]
    rig.client.event("session_start", {"session_id": "S2"})  # another session: sends it, and so does its first prompt
    rig.prompt()
    rig.prompt()
    assert rig.sent() == [FOOTER, FOOTER]


def test_icarus_off_and_on_make_the_next_prompt_send_its_status(system):
    rig = Rig(system)
    rig.client.event("session_start", {"session_id": "S1"})
    rig.prompt()
    rig.sent()
    assert rig.client.set_enabled(False) is False
    assert rig.client.event("before_agent_start", {"prompt": "q"}) is None  # off: cleared, no retrieval
    assert rig.client.event("before_agent_start", {"prompt": "q"}) is None
    assert rig.sent() == [CLEARED, CLEARED]  # the toggle's, then the first prompt's
    assert rig.client.set_enabled(True) is True
    rig.prompt()
    rig.prompt()
    assert rig.sent() == [FOOTER, FOOTER]
    # Straight off and on again between two prompts: the statuses of both, then the prompt's footer.
    assert rig.client.set_enabled(False) is False
    assert rig.client.set_enabled(True) is True
    rig.prompt()
    assert rig.sent() == [CLEARED, FOOTER, FOOTER]


def test_a_failed_ui_call_is_sent_again_at_the_next_prompt(system):
    rig = Rig(system)
    rig.client.event("session_start", {"session_id": "S1"})
    rig.sent()
    rig.ui.fail = True
    rig.client.event("before_agent_start", {"prompt": "q"})  # the footer's call fails (ambient: the hook goes on)
    rig.ui.fail = False
    rig.prompt()
    rig.prompt()
    assert rig.sent() == [FOOTER, FOOTER]


def test_a_new_incarnation_sends_the_footer_at_its_first_prompt(system):
    rig = Rig(system)
    rig.client.event("session_start", {"session_id": "S1"})
    rig.prompt()
    rig.prompt()
    rig.sent()
    rig.hooks.kill("test")
    assert rig.client.status(timeout=5).in_flight == 0  # the restarted incarnation answers
    rig.prompt()
    rig.prompt()
    assert rig.sent() == [FOOTER]
