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



@pytest.mark.timeout(30)
def test_a_log_file_on_a_full_disk_drops_its_lines_says_so_once_and_never_floods_stderr(tmp_path, capfd):
    """`castor demo` / `castor soak` log to a file in their workdir. On a full disk loguru's own file
    sink printed a "Logging error in Loguru Handler" block -- the record and two tracebacks -- on
    stderr for every line (5,573 stderr lines in a 5 s soak), and a traceback at exit. castor's file
    sink drops what it cannot write and says so in one line. (/dev/full: every write is ENOSPC.)"""
    full = tmp_path / "demo.log"
    full.symlink_to("/dev/full")
    configure_logging("INFO", sink=str(full))
    try:
        for n in range(200):
            try:
                raise RuntimeError(f"boom {n}")
            except RuntimeError:
                logger.exception("a crash while the disk is full")
    finally:
        configure_logging("ERROR", json=False)  # closes the file: no flush left to fail at exit
    err = capfd.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err, err[:2000]
    lines = err.splitlines()
    assert len(lines) == 1, lines
    assert str(full) in lines[0] and "ENOSPC" in lines[0], lines


@pytest.mark.timeout(30)
def test_a_log_file_writes_again_once_there_is_room_and_counts_what_it_dropped(tmp_path, capfd, monkeypatch):
    import errno
    import os

    log_path = tmp_path / "soak.log"
    real_write = os.write
    state = {"full": False, "half": False}

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") == str(log_path):
            if state["half"]:  # the page the file ends in takes half the line, then the disk is full
                state["half"] = False
                return real_write(fd, bytes(data[: len(data) // 2]))
            if state["full"]:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    configure_logging("INFO", sink=str(log_path))
    try:
        logger.info("before the disk filled")
        monkeypatch.setattr(os, "write", write)
        state.update(full=True, half=True)
        for n in range(5):
            logger.info("dropped {}", n)
        state["full"] = False
        logger.info("after space was freed")
        monkeypatch.undo()
    finally:
        configure_logging("ERROR", json=False)
    assert len(capfd.readouterr().err.splitlines()) == 1
    lines = log_path.read_text().splitlines()
    assert lines[0].endswith("before the disk filled")
    assert lines[1] and "dropped 0" not in lines[1], lines  # the torn half, closed by a newline
    assert lines[2] == f"castor: 5 log lines were dropped: {log_path} could not be written " \
                       "(ENOSPC: No space left on device)", lines
    assert lines[3].endswith("after space was freed") and len(lines) == 4, lines


_LOG_ON_A_FILLING_DISK = r'''
import errno, os, sys
from castor.logs import configure_logging
from castor._log import logger

disk = sys.argv[1]
configure_logging("INFO", json=True)
for n in range(5):
    logger.info("before {}", n)
with open(os.path.join(disk, "filler.bin"), "wb", buffering=0) as filler:
    try:
        while True:
            filler.write(b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
for n in range(50):
    logger.info("during {} " + "y" * 300, n)
os.unlink(os.path.join(disk, "filler.bin"))
for n in range(3):
    logger.info("after {}", n)
'''


@pytest.mark.timeout(60)
def test_a_json_log_on_stderr_whose_disk_fills_keeps_one_record_a_line_and_counts_the_drops(tmp_path):
    """`castor --log-json serve … 2>>LOG` with LOG's disk filling mid-line: loguru's stream sink kept
    the line's tail in Python's buffer and wrote it in front of a later record, so the log held a line
    that was parts of two records (no JSON), lost others, and said nothing of the lines it dropped.
    stderr now gets the file sink's rule: each record one write to fd 2; after a torn line the next
    record starts a line of its own, after a note of how many were dropped. (A real 256 KiB tmpfs,
    mounted by the test: root only.)"""
    import json
    import os
    import subprocess
    import sys

    from tests.support.tmpfs import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "disk", "256k") as disk:
        log = disk / "castor.log"
        with open(log, "ab") as stderr:
            child = subprocess.run([sys.executable, "-c", _LOG_ON_A_FILLING_DISK, str(disk)], stderr=stderr,
                                   stdout=subprocess.PIPE, timeout=40, env={**os.environ, "CASTOR_LOG_JSON": "1"})
        assert child.returncode == 0
        lines = log.read_text(errors="replace").splitlines()
    records, notes, torn = [], [], []
    for line in lines:
        if line.startswith("castor: "):
            notes.append(line)
            continue
        try:
            records.append(json.loads(line)["record"]["message"])
        except ValueError:
            torn.append(line)
    assert records[:5] == [f"before {n}" for n in range(5)], records
    assert records[-3:] == ["after 0", "after 1", "after 2"], records[-6:]
    assert len(torn) <= 1, torn  # the one record the disk cut short, never two run together
    dropped = 50 - sum(1 for r in records if r.startswith("during"))
    assert dropped > 0 and notes == [f"castor: {dropped} log lines were dropped: stderr could not be "
                                     "written (ENOSPC: No space left on device)"], (notes, dropped, torn)


def test_a_huge_message_is_cut_and_every_json_line_stays_one_valid_object():
    """A message of megabytes (a peer's text quoted whole) made a JSON line of megabytes, twice over
    (``text`` and ``record.message``): now it is cut at MAX_MESSAGE_CHARS and says how long it was.
    Newlines, escapes and undecodable characters stay one valid JSON line each."""
    import json

    from castor.logs import MAX_MESSAGE_CHARS

    sink = io.StringIO()
    configure_logging("INFO", json=True, sink=sink)
    try:
        log = logger.bind(actor="/tests")
        log.warning("huge " + "x" * 2_000_000)
        log.warning("nl\nline\r\x1b[31m and \udcff undecodable")
    finally:
        configure_logging("ERROR", json=False)
    lines = sink.getvalue().splitlines()
    assert len(lines) == 2
    huge, odd = (json.loads(line)["record"] for line in lines)
    assert len(lines[0]) < 3 * MAX_MESSAGE_CHARS
    assert huge["message"].startswith("huge xxx") and huge["message"].endswith("(cut: 2000005 characters in all)")
    if "template" in huge:  # loguru 0.8 serializes the message as given too: cut as well
        assert huge["template"].startswith("huge xxx") and huge["template"].endswith("(cut: 2000005 characters in all)")
        assert len(huge["template"]) < MAX_MESSAGE_CHARS // 8
    assert odd["message"] == "nl\nline\r\x1b[31m and \udcff undecodable"
    assert huge["extra"]["actor"] == odd["extra"]["actor"] == "/tests"
