"""The user's Esc in Pi's terminal while castor is still answering ``before_agent_start``.

A memory retrieval may take seconds. Pi 1.6 holds an Esc's abort until the extension's
``before_agent_start`` handler returns, so the Esc used to take effect only when castor answered.
The extension now watches the terminal for an Esc while it waits (integrations/pi/src/interrupt.ts)
and stops waiting: Pi aborts the run at once, before its first model request, and what castor
answers later is dropped. Driven as a user drives it: the interactive Pi on a pseudo-terminal, a
prompt typed, Esc pressed. castor is the PROBE (whose ``PROBE slow <s>`` prompt makes
before_agent_start take ``<s>`` seconds) or the real runtime with the reference Icarus backend
told to take seconds over its retrieval (``hooks.pre_llm_call``).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.waiting import poll_until, wait_for

from .conftest import read_jsonl
from .pi_tty import ESC
from .test_pi_castor_e2e import icarus_settings

pytestmark = [pytest.mark.pi, pytest.mark.timeout(90)]

SLOW_S = 8.0


def events(log, name):
    return [(i, c["params"]["data"]) for i, c in enumerate(read_jsonl(log))
            if c["method"] == "harness.event" and c["params"]["event"] == name]


def type_slow_prompt(pi, log, seconds: float) -> None:
    """Type ``PROBE slow <seconds>`` and return once the probe is answering its
    ``before_agent_start`` (a beat inside its wait)."""
    prompt = f"PROBE slow {seconds:g}"
    seen = len([d for _, d in events(log, "before_agent_start") if d.get("prompt") == prompt])
    pi.type(prompt)
    wait_for(lambda: len([d for _, d in events(log, "before_agent_start") if d.get("prompt") == prompt]) > seen,
             timeout=15, what=f"before_agent_start of {prompt!r} at the probe; Pi drew: {pi.screen_tail()!r}")
    time.sleep(0.3)  # well inside the probe's wait


def assert_the_run_ends_at_once(pi, log, what: str, since: float, runs: int = 1, within: float = 3.0) -> None:
    """The ``runs``-th ``agent_settled`` reaches castor within ``within`` s of ``since`` (``what``
    was done then), long before the probe answers the slow prompt."""
    wait_for(lambda: len(events(log, "agent_settled")) >= runs, timeout=SLOW_S + 10,
             what=f"agent_settled after {what}; Pi drew: {pi.screen_tail()!r}")
    took = time.monotonic() - since
    assert took < within, f"the run ended {took:.1f} s after {what} (the probe answers after {SLOW_S:g} s)"


@pytest.fixture
def tty_pi(start_tty, probe_command):
    command, log = probe_command
    pi = start_tty(command, env={"CASTOR_PROBE_LOG": str(log)})
    wait_for(lambda: events(log, "session_start"), timeout=20,
             what=f"session_start at the probe; Pi drew: {pi.screen_tail()!r}")
    return pi, log


def test_esc_during_a_slow_before_agent_start_aborts_the_run_at_once(tty_pi, fake_llm):
    pi, log = tty_pi
    type_slow_prompt(pi, log, SLOW_S)
    pressed = time.monotonic()
    pi.press(ESC)
    # The run ends (agent_end / agent_settled reach castor) long before the probe answers.
    assert_the_run_ends_at_once(pi, log, "the Esc", pressed)
    settled = events(log, "agent_settled")[0][1]
    assert settled.get("aborted") is True, settled
    assert not fake_llm.log(), "the aborted run made a model request"

    # Pi stays usable, and the slow answer, when it comes, reaches no model.
    pi.type("after the esc")
    wait_for(lambda: any("after the esc" in str(r) for r in fake_llm.log()), timeout=15,
             what=f"the next prompt's model request; Pi drew: {pi.screen_tail()!r}")
    wait_for(lambda: any(c["method"] == "slow_answered" for c in read_jsonl(log)), timeout=SLOW_S + 5,
             what="the probe's late answer")
    wait_for(lambda: len(events(log, "agent_settled")) >= 2, timeout=15, what="the next prompt's end")
    assert not any("PROBE-LATE" in str(r) for r in fake_llm.log()), "the dropped answer reached the model"


def test_keys_other_than_esc_do_not_end_the_wait(tty_pi, fake_llm):
    pi, log = tty_pi
    pi.type("PROBE slow 2")
    wait_for(lambda: events(log, "before_agent_start"), timeout=15,
             what=f"before_agent_start at the probe; Pi drew: {pi.screen_tail()!r}")
    started = time.monotonic()
    pi.press(b"\x1b[A")  # an arrow key: an escape sequence, not Esc
    pi.press(b"x")
    wait_for(lambda: any("PROBE-LATE" in str(r) for r in fake_llm.log()), timeout=15,
             what=f"the slow answer reaching the model; Pi drew: {pi.screen_tail()!r}")
    assert time.monotonic() - started >= 1.5, "the wait ended before the probe answered"
    wait_for(lambda: events(log, "agent_settled"), timeout=15, what="the run's end")
    assert events(log, "agent_settled")[0][1].get("aborted") is not True


def test_esc_during_a_slow_memory_retrieval_of_the_real_runtime(start_tty, fake_llm, castor_command, tmp_path):
    """The real castor, the reference Icarus backend taking 5 s to retrieve: the Esc ends the wait at
    once; the retrieval runs to its end in the worker (the protocol has no cancel for it: its answer
    is dropped, the worker is not killed), and the next prompt is answered -- after at most 2 s more
    of it, without memory context (castor answers the stopped retrieval first)."""
    call_log = tmp_path / "icarus-calls.jsonl"
    controls = json.dumps({"hooks.pre_llm_call": {"sleep_ms": 5000}})
    pi = start_tty(castor_command, settings=icarus_settings(tmp_path),
                   env={"ICARUS_REF_CALL_LOG": str(call_log), "ICARUS_REF_CONTROLS": controls})

    def retrievals(phase):
        return [c for c in read_jsonl(call_log) if c["call"] == "hooks.pre_llm_call" and c["phase"] == phase]

    # The first prompt may come before the worker is up: typed once the session has started it.
    wait_for(lambda: any(c["call"] == "hooks.on_session_start" for c in read_jsonl(call_log)), timeout=30,
             what=f"the Icarus session start; Pi drew: {pi.screen_tail()!r}")
    pi.type("first prompt about zebras")
    wait_for(lambda: retrievals("start"), timeout=15, what=f"the retrieval's start; Pi drew: {pi.screen_tail()!r}")
    time.sleep(0.3)
    pressed = time.monotonic()
    pi.press(ESC)
    wait_for(lambda: "stopped waiting" in pi.screen_tail(20000), timeout=3,
             what=f"the extension's Esc notice within 3 s; Pi drew: {pi.screen_tail()!r}")
    assert time.monotonic() - pressed < 3.0
    assert not poll_until(lambda: fake_llm.log(), timeout=1.0), "the aborted run made a model request"
    assert not retrievals("end"), "the retrieval cannot have ended yet (it takes 5 s)"

    pi.type("second prompt")
    wait_for(lambda: any("second prompt" in str(r) for r in fake_llm.log()), timeout=20,
             what=f"the next prompt's model request; Pi drew: {pi.screen_tail()!r}")
    wait_for(lambda: retrievals("end"), timeout=10, what="the first retrieval left to finish")
    pids = {c["pid"] for c in read_jsonl(call_log)}
    assert len(pids) == 1, f"the worker was replaced: {pids}"


@pytest.mark.parametrize("command", ["/new", "/compact", "/quit"])
def test_a_command_that_stops_the_run_typed_during_a_slow_before_agent_start_ends_the_wait(tty_pi, fake_llm, command):
    """``/new``, ``/compact`` and ``/quit`` typed while castor answers ``before_agent_start``: each
    makes Pi abort the run and wait for it, and the run waited for the handler -- the slow answer's
    whole time. The extension watches the editor's submit for them as for an Esc."""
    pi, log = tty_pi
    type_slow_prompt(pi, log, SLOW_S)
    typed = time.monotonic()
    pi.type(command)
    assert_the_run_ends_at_once(pi, log, command, typed)
    assert not fake_llm.log(), "the stopped run made a model request"
    if command == "/new":
        wait_for(lambda: len(events(log, "session_start")) >= 2, timeout=10,
                 what=f"the new session's start; Pi drew: {pi.screen_tail()!r}")


def test_a_fork_chosen_during_a_slow_before_agent_start_ends_the_wait_and_closing_its_picker_does_not(tty_pi, fake_llm):
    """``/fork`` opens a picker of the session's prompts; choosing one (Enter) replaces the session,
    which aborts the run and waits for it. Closing the picker (Esc) leaves the run alone: the wait
    goes on, and the prompt gets castor's answer."""
    pi, log = tty_pi
    fake_llm.reply_text("FIRST-ANSWER", when="first prompt")
    pi.type("first prompt")
    wait_for(lambda: events(log, "agent_settled"), timeout=20,
             what=f"the first run's end; Pi drew: {pi.screen_tail()!r}")
    # A picker closed with Esc: not a stop.
    type_slow_prompt(pi, log, 3)
    pi.type("/fork")
    time.sleep(0.5)  # the picker is drawn
    pi.press(ESC)
    wait_for(lambda: any("PROBE-LATE" in str(r) for r in fake_llm.log()), timeout=15,
             what=f"the slow answer reaching the model; Pi drew: {pi.screen_tail()!r}")
    wait_for(lambda: len(events(log, "agent_settled")) >= 2, timeout=15, what="the second run's end")
    assert events(log, "agent_settled")[1][1].get("aborted") is not True
    # A fork chosen: the run stops at once.
    type_slow_prompt(pi, log, SLOW_S)
    typed = time.monotonic()
    pi.type("/fork")
    time.sleep(0.5)
    pi.press(b"\r")
    assert_the_run_ends_at_once(pi, log, "the fork", typed, runs=3, within=3.5)
