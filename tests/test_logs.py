"""castor's human log format: one line a record, whatever text a peer put in the message."""

from __future__ import annotations

import io

import pytest
from loguru import logger

from castor.logs import configure_logging


@pytest.fixture
def human_log():
    sink = io.StringIO()
    configure_logging("DEBUG", json=False, sink=sink)
    yield sink
    configure_logging("ERROR", json=False)


@pytest.mark.timeout(10)
def test_a_newline_or_an_escape_a_peer_chose_does_not_start_a_line_or_reach_the_terminal(human_log):
    logger.warning("notification {!s} failed", "x\n00:00:00.000 INFO     - forged\r\x1b[2J\x7f")
    lines = human_log.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].endswith("notification x\\n00:00:00.000 INFO     - forged\\r\\x1b[2J\\x7f failed")


@pytest.mark.timeout(10)
def test_a_traceback_still_follows_its_record_on_lines_of_its_own(human_log):
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("handler\nfailed")
    lines = human_log.getvalue().splitlines()
    assert lines[0].endswith("handler\\nfailed") and lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: boom"


@pytest.mark.timeout(20)
def test_the_json_log_names_the_message_an_actor_was_handling():
    """An actor's line logged while it handles a message carries that message's type in the JSON
    log; it used to read "-" on every line once castor's logging was configured (its defaults were
    taken for a type the line named), and only without castor's configuration did it show."""
    import json

    from castor.messages.base import LocalMessage
    from castor.supervision import Actor, ActorSystem, ChildSpec, Strategy, handles, supervisor_spec

    class Nudge(LocalMessage, type_name="tests.logs.nudge"):
        n: int

    class Talker(Actor):
        @handles(Nudge)
        def nudge(self, message: Nudge) -> int:
            self.log.warning("handling nudge {}", message.n)
            self.log.bind(msg_type="tests.logs.named").warning("a line that names its own type")
            return message.n

    sink = io.StringIO()
    configure_logging("DEBUG", json=True, sink=sink)
    system = ActorSystem([supervisor_spec("grp", [ChildSpec("talker", Talker)], strategy=Strategy.ONE_FOR_ONE)])
    try:
        assert system.lookup("/root/grp/talker").ask(Nudge(n=1), timeout=5) == 1
    finally:
        system.shutdown(10)
        configure_logging("ERROR", json=False)
    records = [json.loads(line)["record"] for line in sink.getvalue().splitlines()]
    [handling] = [r for r in records if "handling nudge" in r["message"]]
    assert handling["extra"]["msg_type"] == "tests.logs.nudge" and handling["extra"]["actor"] == "/root/grp/talker"
    [named] = [r for r in records if "names its own type" in r["message"]]
    assert named["extra"]["msg_type"] == "tests.logs.named"
    assert all(r["extra"]["msg_type"] for r in records)  # "-" outside a message, never missing


@pytest.mark.timeout(20)
def test_a_retirement_a_handler_asked_for_names_the_message_it_was_handling():
    """A worker actor that retires because its call timed out logged "retiring: call
    hooks.pre_llm_call timed out" with ``msg_type`` "-": the retirement runs once the handler has
    returned, and the line lost the message it was decided on. It now names it."""
    import json

    from castor.messages.base import LocalMessage
    from castor.supervision import Actor, ActorSystem, ChildSpec, Restart, handles

    class GiveUp(LocalMessage, type_name="tests.logs.give_up"):
        pass

    class Quitter(Actor):
        @handles(GiveUp)
        def give_up(self, _message: GiveUp) -> None:
            self.retire("a call timed out")

    sink = io.StringIO()
    configure_logging("DEBUG", json=True, sink=sink)
    system = ActorSystem()
    try:
        handle = system.spawn(ChildSpec("quitter", Quitter, restart=Restart.TEMPORARY))
        handle.ask(GiveUp(), timeout=5)
        assert handle.closed.wait(5)
    finally:
        system.shutdown(10)
        configure_logging("ERROR", json=False)
    records = [json.loads(line)["record"] for line in sink.getvalue().splitlines()]
    [retiring] = [r for r in records if r["message"] == "retiring: a call timed out"]
    assert retiring["extra"]["msg_type"] == "tests.logs.give_up", retiring["extra"]


_EMBEDDER = """
import sys
from castor.supervision import Actor, ActorSystem, ChildSpec, Restart

class Quiet(Actor):
    pass

if sys.argv[1] == "configured":
    from castor.logs import configure_logging
    configure_logging("DEBUG")
from loguru import logger
logger.warning("the program's own line")
with ActorSystem() as system:
    handle = system.spawn(ChildSpec("a", Quiet, restart=Restart.TEMPORARY))
    handle.kill("a crash the test injects")
    assert handle.closed.wait(5)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["library", "configured"])
def test_castor_as_a_library_logs_nothing_until_the_program_configures_logging(tmp_path, how):
    """A program that imports castor keeps its stderr: loguru's default handler would print
    castor's lines (a crash's ERROR and its traceback here) into it. Its own lines still show."""
    import subprocess
    import sys

    script = tmp_path / "embedder.py"
    script.write_text(_EMBEDDER)
    proc = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert "the program's own line" in proc.stderr
    crashed = "actor crashed: ActorKilled: a crash the test injects" in proc.stderr
    assert crashed is (how == "configured"), proc.stderr
