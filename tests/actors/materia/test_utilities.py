"""Utility sockets through the UtilityExecutorActor pool: real commands, real process trees."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

from castor.actors.materia.api import materia_call
from castor.messages.errors import Forbidden
from castor.supervision import faults

from .helpers import event_types, events, open_session, wait_for, wait_status, write_project_config

if TYPE_CHECKING:
    from castor.supervision.handle import ActorHandle
    from castor.supervision.registry import Registry


def _config(command: list[str], *, timeout_ms: int | None = None) -> dict:
    socket = {"type": "utility", "command": command, "parse": "json", "assign": {"got": "$"},
              "edges": [{"when": "always", "to": "Socket-2"}]}
    if timeout_ms is not None:
        socket["timeoutMs"] = timeout_ms
    return {"activeLoadout": "cmd", "loadouts": {"cmd": {"entry": "Socket-1", "sockets": {
        "Socket-1": socket, "Socket-2": {"type": "agent", "materia": "greeter"}}}}}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_utility_socket_runs_a_real_command_with_the_cast_input_on_stdin(runtime_factory, project):
    code = ("import sys, json, os; d = json.load(sys.stdin); "
            "print(json.dumps({'request': d['request'], 'socket': d['socketId'], 'cwd': os.getcwd()}))")
    write_project_config(project, _config([sys.executable, "-c", code]))
    rt = runtime_factory()
    agent, _ui = open_session(rt, "s1", project, ["summarised"])
    started = materia_call(rt, "s1", "start", {"request": "count files"})
    view = wait_status(rt, "s1", started["cast_id"])
    assert view["status"] == "complete", view
    run_dir = Path(view["run_dir"])
    parsed = json.loads((run_dir / "sockets" / "Socket-1" / "1.json").read_text())
    assert parsed == {"request": "count files", "socket": "Socket-1", "cwd": str(project)}
    assert json.loads((run_dir / "sockets" / "Socket-1" / "1.input.json").read_text())["castId"] == started["cast_id"]
    command_event = next(e for e in events(run_dir) if e["type"] == "utility_command")
    assert command_event["data"]["code"] == 0 and command_event["data"]["timedOut"] is False
    assert (run_dir / "sockets" / "Socket-1" / "1.command.stdout.txt").is_file()
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert state["data"]["got"]["request"] == "count files"


@pytest.mark.timeout(30)
def test_utility_timeout_kills_the_whole_tree_including_a_grandchild(runtime_factory, project):
    pid_file = project / "grandchild.pid"
    code = ("import subprocess, sys; "
            f"subprocess.Popen(['sh', '-c', 'sleep 60 & echo $! > {pid_file}; wait']).wait()")
    write_project_config(project, _config([sys.executable, "-c", code], timeout_ms=700))
    rt = runtime_factory()
    open_session(rt, "s1", project, ["unused"])
    started = materia_call(rt, "s1", "start", {"request": "hang"})
    grandchild = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="grandchild pid"))
    view = wait_status(rt, "s1", started["cast_id"], timeout=15)
    assert view["status"] == "failed" and "timed out" in view["failed_reason"]
    wait_for(lambda: not _alive(grandchild), timeout=5, what="the grandchild to die")
    command_event = next(e for e in events(view["run_dir"]) if e["type"] == "utility_command")
    assert command_event["data"]["timedOut"] is True


@pytest.mark.timeout(30)
def test_killed_utility_process_is_rerun_under_a_new_visit_and_the_cast_completes(runtime_factory, project):
    marker = project / "ran-once"
    pid_file = project / "first.pid"
    code = ("import os, sys, time, json; sys.stdin.read(); m = sys.argv[1]\n"
            "if os.path.exists(m): print(json.dumps({'ok': True})); sys.exit(0)\n"
            "open(m, 'w').close(); open(sys.argv[2], 'w').write(str(os.getpid())); time.sleep(60)")
    write_project_config(project, _config([sys.executable, "-c", code, str(marker), str(pid_file)]))
    rt = runtime_factory(utility_slots=2)
    open_session(rt, "s1", project, ["done"])
    started = materia_call(rt, "s1", "start", {"request": "work"})
    first = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="first run"))
    slot = next(
        h for h in rt.system.registry.handles("/root/utility") if first in (h.actor.owned_pids() if h.actor else [])
    )
    killed = faults.kill_process(slot)
    assert first in killed
    view = wait_status(rt, "s1", started["cast_id"], timeout=15)
    assert view["status"] == "complete", view
    assert view["visits"]["Socket-1"] == 2  # a re-dispatch is a new visit, never the same visit twice
    assert not _alive(first)
    assert "cast_recast" in event_types(view["run_dir"])
    # The command ran and was killed, so it ran again from the start: the cast says so, as after its
    # own actor's restart (before, a slot's death re-ran it without a word).
    (interrupted,) = [e["data"] for e in events(view["run_dir"]) if e["type"] == "utility_interrupted"]
    assert interrupted["socket"] == "Socket-1" and interrupted["cause"].startswith("its work was lost (utility killed")


def test_untrusted_session_refuses_project_utility_commands(runtime_factory, project):
    write_project_config(project, _config(["true"]))
    rt = runtime_factory()
    open_session(rt, "s1", project, ["x"], trusted=False)
    with pytest.raises(Forbidden):
        materia_call(rt, "s1", "start", {"request": "run it"})
    assert not (project / ".pi" / "pi-materia").exists() or not any((project / ".pi" / "pi-materia").iterdir())


def test_a_queued_job_cancelled_before_it_starts_never_runs():
    from castor.actors.materia.utility_pool import UtilityPoolState

    pool = UtilityPoolState(slots=1, queue_limit=10)
    pool.cancel_queued("cast:Socket-1:1:1")
    assert pool.begin("cast:Socket-1:1:1") == "cancelled"
    assert pool.begin("cast:Socket-1:2:2") is None  # other visits are untouched
    pool.cancel_queued("cast:Socket-1:2:2")  # claimed, no process yet: killed the moment it starts

    class Started:
        killed = False

        def kill(self):
            self.killed = True

    started = Started()
    pool.started("cast:Socket-1:2:2", started)
    assert pool.is_cancelled("cast:Socket-1:2:2") and started.killed


def test_a_job_stopped_gently_while_it_starts_gets_the_same_grace_as_a_running_one():
    """A session closing while its cast's command is being started (spawned, not yet registered
    as running) asks for SIGTERM and a grace; the command used to be SIGKILLed as it registered,
    its TERM trap never ran (a loaded CI machine lost the ``TERM`` line of
    test_close_during_utility.py)."""
    from castor.actors.materia.utility_pool import UTILITY_STOP_GRACE_S, UtilityPoolState

    pool = UtilityPoolState(slots=1, queue_limit=10)
    assert pool.begin("cast:Socket-1:1:1") is None  # claimed by a slot, no process yet
    pool.cancel_queued("cast:Socket-1:1:1", UTILITY_STOP_GRACE_S)

    class Started:
        ended_by: tuple[str, float | None] | None = None

        def kill(self) -> None:
            self.ended_by = ("kill", None)

        def terminate(self, grace_s: float) -> None:
            self.ended_by = ("terminate", grace_s)

    started = Started()
    pool.started("cast:Socket-1:1:1", started)
    assert started.ended_by == ("terminate", UTILITY_STOP_GRACE_S)


# -- the live pool (/root/utility): at most one run per dispatch, a bounded queue --------------------------

class _Inbox:
    """Stands in for the cast's handle: what the pool tells the cast, in order."""

    def __init__(self) -> None:
        import queue

        self.messages: queue.Queue = queue.Queue()

    def tell(self, message) -> None:
        self.messages.put(message)

    def next(self, timeout: float = 15.0):
        import queue

        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the pool told the cast nothing within {timeout}s") from None


def _job(visit_id: str, argv: list[str], cwd: Path, inbox: _Inbox):
    from castor.actors.materia.messages import UtilityJob
    from castor.domain.materia.cast_messages import RunUtility

    effect = RunUtility(visit_id=visit_id, socket_id="Socket-1", visit=1, command=tuple(argv), stdin_json={},
                        timeout_ms=20_000, max_output_bytes=4096, cwd=str(cwd))
    return UtilityJob(effect=effect, cast=inbox)


_APPEND_VISIT = (
    "import os, sys\nwith open(sys.argv[1], 'a') as f:\n    f.write(os.environ['CASTOR_VISIT_ID'] + '\\n')\n"
    "print('ran')"
)


@pytest.mark.timeout(30)
def test_a_duplicate_job_is_never_run_twice_its_recorded_outcome_is_re_sent(runtime_factory, project):
    from castor.actors.materia.messages import CastOutcome
    from castor.actors.materia.utility_pool import submit_utility

    log = project / "runs.log"
    rt = runtime_factory(utility_slots=2)
    inbox = _Inbox()
    job = _job("c1:Socket-1:1:1", [sys.executable, "-c", _APPEND_VISIT, str(log)], project, inbox)
    submit_utility(rt.system.registry, job)
    first = inbox.next()
    assert isinstance(first, CastOutcome) and first.event.exit_code == 0 and first.event.stdout == "ran\n"
    submit_utility(rt.system.registry, job)  # the same dispatch delivered again (a re-sent job)
    again = inbox.next()
    assert isinstance(again, CastOutcome) and again.event == first.event  # the recorded outcome, same `at`
    assert log.read_text() == "c1:Socket-1:1:1\n"  # the command ran once
    # A different dispatch of the same socket is new work: it runs.
    submit_utility(rt.system.registry, _job("c1:Socket-1:2:2", [sys.executable, "-c", _APPEND_VISIT, str(log)],
                                            project, inbox))
    assert inbox.next().event.visit_id == "c1:Socket-1:2:2"
    assert log.read_text() == "c1:Socket-1:1:1\nc1:Socket-1:2:2\n"


@pytest.mark.timeout(30)
def test_a_command_with_a_nul_in_an_argument_is_a_spawn_error_not_a_crashed_slot(runtime_factory, project):
    """No process can be given such an argument: the slot crashed on it at every dispatch (four
    ValidationError tracebacks, each a new visit) and the cast failed "work lost 4 times"."""
    from castor.actors.materia.messages import CastOutcome
    from castor.actors.materia.utility_pool import submit_utility

    rt = runtime_factory(utility_slots=1)
    inbox = _Inbox()
    submit_utility(rt.system.registry, _job("c1:Socket-1:1:1", ["echo", "h\0i"], project, inbox))
    outcome = inbox.next()
    assert isinstance(outcome, CastOutcome) and "NUL" in (outcome.event.spawn_error or ""), outcome
    submit_utility(rt.system.registry, _job("c1:Socket-1:2:2", ["echo", "ok"], project, inbox))
    assert inbox.next().event.stdout == "ok\n"  # the slot lives on


@pytest.mark.timeout(30)
def test_a_job_whose_cast_stopped_meanwhile_is_not_a_warning(runtime_factory, project):
    """An abort of a cast whose command runs stops the cast first; the slot's answer then met a
    stopped actor and was logged as a WARNING on the CLI after the abort's own notice."""
    from loguru import logger

    from castor.actors.materia.utility_pool import submit_utility
    from castor.messages.errors import ActorStopped

    class StoppedCast(_Inbox):
        def tell(self, message) -> None:
            super().tell(message)
            raise ActorStopped("exited (stopped)")

    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
    try:
        rt = runtime_factory(utility_slots=1)
        gone = StoppedCast()
        submit_utility(rt.system.registry, _job("c1:Socket-1:1:1", ["echo", "late"], project, gone))
        gone.next()
        inbox = _Inbox()
        submit_utility(rt.system.registry, _job("c2:Socket-1:1:1", ["echo", "ok"], project, inbox))
        assert inbox.next().event.stdout == "ok\n"
    finally:
        logger.remove(sink)
    assert not [w for w in warnings if "actor_stopped" in w], warnings


_WAIT_FOR_GO = ("import os, sys, time\nopen(sys.argv[2], 'a').write('x')\nd = time.time() + 30\n"
                "while not os.path.exists(sys.argv[1]) and time.time() < d:\n    time.sleep(0.01)\nprint('done')")


@pytest.mark.timeout(40)
def test_a_duplicate_of_a_running_job_is_dropped_not_started_again(runtime_factory, project):
    from castor.actors.materia.utility_pool import pool_of, submit_utility

    go, starts = project / "go", project / "starts"
    rt = runtime_factory(utility_slots=2)
    inbox = _Inbox()
    job = _job("c1:Socket-1:1:1", [sys.executable, "-c", _WAIT_FOR_GO, str(go), str(starts)], project, inbox)
    submit_utility(rt.system.registry, job)
    wait_for(lambda: starts.exists(), what="the first run to start")
    submit_utility(rt.system.registry, job)  # lands on the other, idle slot while the first still runs
    wait_for(lambda: pool_of(rt.system.registry).outstanding() == 1, what="the duplicate to be handled")
    go.touch()
    assert inbox.next().event.stdout == "done\n"
    assert starts.read_text() == "x"  # started once
    assert inbox.messages.empty()  # and answered once


@pytest.mark.timeout(40)
def test_the_runtime_pool_refuses_a_job_past_its_queue_bound_and_the_cast_fails_the_visit(runtime_factory, project):
    """slots + utility_queue_limit jobs outstanding: one more is MailboxFull at once (the sender never
    blocks), and a cast whose utility dispatch is refused fails that visit with DispatchFailed."""
    from castor.actors.materia.utility_pool import pool_of, submit_utility
    from castor.messages.errors import MailboxFull

    go, starts = project / "go", project / "starts"
    rt = runtime_factory(utility_slots=1, utility_queue_limit=2)
    inbox = _Inbox()
    argv = [sys.executable, "-c", _WAIT_FOR_GO, str(go), str(starts)]
    for n in range(3):  # one runs, two queue
        submit_utility(rt.system.registry, _job(f"c1:Socket-1:{n}:{n}", argv, project, inbox))
    wait_for(lambda: starts.exists(), what="the running job")
    with pytest.raises(MailboxFull) as full:
        submit_utility(rt.system.registry, _job("c1:Socket-1:9:9", argv, project, inbox))
    assert full.value.may_have_started is False
    assert (full.value.data["slots"], full.value.data["queue_limit"]) == (1, 2)
    assert pool_of(rt.system.registry).outstanding() == 3  # the refused job took no place

    # A cast whose command meets the full pool: its visit fails DispatchFailed (recastable).
    write_project_config(project, _config([sys.executable, "-c", "print('{}')"]))
    open_session(rt, "s1", project, ["unused"])
    started = materia_call(rt, "s1", "start", {"request": "x"})
    view = wait_status(rt, "s1", started["cast_id"], timeout=15)
    assert view["status"] == "failed" and "utility pool full" in view["failed_reason"], view
    assert view["resumable"] is True
    go.touch()
    assert sorted(inbox.next().event.visit_id for _ in range(3)) == [f"c1:Socket-1:{n}:{n}" for n in range(3)]
    wait_for(lambda: pool_of(rt.system.registry).outstanding() == 0, what="the pool to drain")
    submit_utility(rt.system.registry, _job("c1:Socket-1:10:10", argv, project, inbox))  # room again
    assert inbox.next().event.stdout == "done\n"


@pytest.mark.timeout(60)
def test_the_runtime_pool_never_runs_more_commands_than_slots_under_20_submissions(runtime_factory, project):
    from castor.actors.materia.utility_pool import pool_of, submit_utility

    go, starts = project / "go", project / "starts"
    rt = runtime_factory(utility_slots=3, utility_queue_limit=50)
    inbox = _Inbox()
    argv = [sys.executable, "-c", _WAIT_FOR_GO, str(go), str(starts)]
    for n in range(20):
        submit_utility(rt.system.registry, _job(f"c1:Socket-1:{n}:{n}", argv, project, inbox))
    wait_for(lambda: starts.exists() and len(starts.read_text()) == 3, what="three commands running")
    slots = list(rt.system.registry.handles("/root/utility"))
    wait_for(lambda: sum(1 for h in slots if h.actor and h.actor.owned_pids()) == 3, what="three slots busy")
    assert pool_of(rt.system.registry).outstanding() == 20
    assert len(starts.read_text()) == 3  # nobody got past the slots while three run
    go.touch()
    done = sorted(inbox.next().event.visit_id for _ in range(20))
    assert done == sorted(f"c1:Socket-1:{n}:{n}" for n in range(20))
    assert len(starts.read_text()) == 20
    wait_for(lambda: pool_of(rt.system.registry).outstanding() == 0, what="the pool to drain")


def test_a_command_that_cannot_start_is_a_spawn_error_and_frees_its_slot(runtime_factory, project):
    from castor.actors.materia.utility_pool import pool_of, submit_utility

    rt = runtime_factory(utility_slots=1, utility_queue_limit=1)
    inbox = _Inbox()
    for n in range(3):  # more than slots + queue in total: each one freed its place
        submit_utility(rt.system.registry, _job(f"c1:Socket-1:{n}:{n}", [str(project / "missing-binary")],
                                                project, inbox))
        outcome = inbox.next().event
        assert outcome.spawn_error and outcome.exit_code is None
    wait_for(lambda: pool_of(rt.system.registry).outstanding() == 0, what="the slot freed")
    submit_utility(rt.system.registry, _job("c1:Socket-1:9:9", [sys.executable, "-c", "print('ok')"], project, inbox))
    assert inbox.next().event.stdout == "ok\n"


def test_an_untrusted_session_never_resumes_a_shipped_cast_that_runs_commands(runtime_factory, project, tmp_path):
    """A checkout can ship a saved cast (or edit one): its state.json holds the resolved config,
    commands included, and nothing proves castor wrote it. Copied into a project with no config
    at all, an untrusted session's recast and revive are refused before anything runs (continue
    takes an active saved cast in through the same check); a trusted session resumes it (so the
    tripwire works)."""
    import shutil

    marker = tmp_path / "shipped-command-ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('ran\\n'); raise SystemExit(3)"]
    write_project_config(project, _config(command))
    rt = runtime_factory()
    open_session(rt, "maker", project, ["x"], trusted=True)
    made = materia_call(rt, "maker", "start", {"request": "make a recastable failure"})
    assert wait_status(rt, "maker", made["cast_id"])["status"] == "failed"
    assert marker.read_text() == "ran\n"
    marker.unlink()
    rt.close_session("maker")

    shipped = tmp_path / "checkout"
    (shipped / ".pi").mkdir(parents=True)
    shutil.copytree(project / ".pi" / "pi-materia", shipped / ".pi" / "pi-materia",
                    ignore=shutil.ignore_patterns("*.lock", ".castor-index*"))
    open_session(rt, "victim", shipped, ["x"], trusted=False)
    for verb, params in (("recast", {}), ("recast", {"cast_id": made["cast_id"]}),
                         ("revive", {"cast_id": made["cast_id"]})):
        with pytest.raises(Forbidden) as refused:
            materia_call(rt, "victim", verb, params)
        assert refused.value.data["reason"] == "untrusted_project", (verb, refused.value)
        assert refused.value.data["cast_id"] == made["cast_id"]
    assert not marker.exists(), "a command of the shipped cast ran"

    open_session(rt, "trusting", shipped, ["x"], trusted=True)
    materia_call(rt, "trusting", "recast", {})
    wait_for(marker.exists, timeout=10, what="the trusted recast to run the command")


@pytest.mark.timeout(30)
def test_the_footer_names_a_running_utility_not_the_agent_turn_before_it_and_an_abort_clears_it(runtime_factory,
                                                                                                 project):
    """While a utility socket's command runs, the footer said the previous agent turn still ran
    ("materia: greeter (Socket-1)"), or nothing at all for a cast that starts with one: a user who
    pressed Esc to stop that turn stopped nothing. It names the utility, as pi-materia's does."""
    pid_file = project / "util.pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    write_project_config(project, {"activeLoadout": "cmd", "loadouts": {"cmd": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "greeter", "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "utility", "command": [sys.executable, "-c", code], "timeoutMs": 60000}}}}})
    rt = runtime_factory()
    _agent, ui = open_session(rt, "s1", project, ["greeted"])
    started = materia_call(rt, "s1", "start", {"request": "greet then wait"})
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the utility running"))
    assert wait_for(lambda: ui.statuses.get("materia") == "materia: utility (Socket-2)", timeout=5,
                    what=f"the utility's footer, not {ui.statuses.get('materia')!r}")
    materia_call(rt, "s1", "abort", {"cast_id": started["cast_id"]})
    wait_for(lambda: not _alive(pid), timeout=5, what="the utility's command to end")
    assert wait_for(lambda: "materia" not in ui.statuses, timeout=5, what="the footer cleared by the abort")


class _CutOffCommand:
    """A command on a cluster node cut off from the cluster: a kill does not reach it, it ends when
    its lease lapses (``lapse``). Stands in for what tests/scaleout builds with network namespaces."""

    finished = False

    def __init__(self, cmd, lapse) -> None:
        import threading

        self.cmd, self.lapse, self.killed = cmd, lapse, threading.Event()

    def pids(self) -> list[int]:
        return []

    def kill(self) -> None:
        self.killed.set()

    def terminate(self, grace_s: float) -> None:
        self.kill()

    def wait(self):
        from castor.adapters.materia.process_runner import UtilityResult

        assert self.lapse.wait(30), "the test never let the lease lapse"
        return UtilityResult(argv=list(self.cmd.argv), pid=0, exit_code=0, signal=None, signal_name=None,
                             timed_out=False, killed=self.killed.is_set(), duration_ms=1.0, stdout="done\n",
                             stderr="", stdout_truncated=False, stderr_truncated=False,
                             max_bytes=self.cmd.max_output_bytes, timeout_ms=self.cmd.timeout_ms)


class _CutOffRunner:
    fence_s = 4.0  # how long its commands may run on after their cast host is lost

    def __init__(self) -> None:
        import threading

        self.lapse = threading.Event()
        self.spawned: list[_CutOffCommand] = []

    def spawn(self, cmd, resources=None) -> _CutOffCommand:
        running = _CutOffCommand(cmd, self.lapse)
        self.spawned.append(running)
        return running


def _two_slots_whose_commands_run_cut_off(
        runtime_factory, project: Path) -> tuple[Registry[ActorHandle], _CutOffRunner, Path, _Inbox]:
    """A runtime with two utility slots whose commands run on a :class:`_CutOffRunner`: its
    registry, that runner, a cast's run directory (``run-a``, made) and the inbox its outcomes reach."""
    from castor.actors.materia.utility_pool import pool_of

    rt = runtime_factory(utility_slots=2)
    registry = rt.system.registry
    runner = pool_of(registry).remote_runner = _CutOffRunner()
    run_dir = project / "run-a"
    run_dir.mkdir()
    return registry, runner, run_dir, _Inbox()


@pytest.mark.timeout(40)
def test_a_casts_next_command_waits_for_the_one_it_gave_up_to_end(runtime_factory, project):
    """An abort, then a recast at once: the aborted command may still be ending -- on a cluster node
    cut off from the cluster it runs until its lease lapses -- and the recast's command started at
    once, two commands of one cast on the same project. The next command of the cast now waits for
    it (the cast's snapshot says so); another cast's command does not; a waiting one cancelled
    never starts."""
    from castor.actors.materia.messages import UtilityJob, WorkLost
    from castor.actors.materia.utility_pool import cancel_utility, pool_of, submit_utility

    rt = runtime_factory(utility_slots=3)
    registry = rt.system.registry
    pool = pool_of(registry)
    runner = pool.remote_runner = _CutOffRunner()
    run_dir, other_dir = project / "run-a", project / "run-b"
    run_dir.mkdir()
    other_dir.mkdir()
    inbox = _Inbox()

    def job(visit_id: str, where: Path) -> UtilityJob:
        plain = _job(visit_id, ["true"], project, inbox)
        return UtilityJob(effect=plain.effect, cast=inbox, run_dir=str(where))

    first, second = "c1:Socket-1:1:1", "c1:Socket-1:2:2"
    submit_utility(registry, job(first, run_dir))
    wait_for(lambda: len(runner.spawned) == 1, what="the first command to start")
    assert cancel_utility(registry, first)  # the abort: the kill does not reach the cut-off node
    submit_utility(registry, job(second, run_dir))  # the recast, at once
    wait_for(lambda: pool.progress_of(second)[0] == "waiting", what="the recast's command to wait")
    submit_utility(registry, job("c2:Socket-1:1:1", other_dir))  # another cast is not held up
    wait_for(lambda: len(runner.spawned) == 2, what="the other cast's command to start")
    assert [r.cmd.env["CASTOR_VISIT_ID"] for r in runner.spawned] == [first, "c2:Socket-1:1:1"]
    runner.lapse.set()  # the lease lapses: the aborted command ends (killed: lost work, ignored by its cast)
    told = [inbox.next() for _ in range(3)]
    assert len(runner.spawned) == 3 and runner.spawned[2].cmd.env["CASTOR_VISIT_ID"] == second
    assert sorted(type(m).__name__ for m in told) == ["CastOutcome", "CastOutcome", "WorkLost"]
    assert next(m for m in told if isinstance(m, WorkLost)).visit_id == first

    # A waiting command given up (a second abort) never starts.
    runner.lapse.clear()
    third, fourth = "c1:Socket-1:3:3", "c1:Socket-1:4:4"
    submit_utility(registry, job(third, run_dir))
    wait_for(lambda: len(runner.spawned) == 4, what="the third command to start")
    cancel_utility(registry, third)
    submit_utility(registry, job(fourth, run_dir))
    wait_for(lambda: pool.progress_of(fourth)[0] == "waiting", what="the fourth command to wait")
    assert not cancel_utility(registry, fourth)  # no process yet: it will never start
    assert isinstance(inbox.next(), WorkLost)  # the fourth, given up while it waited
    runner.lapse.set()
    assert isinstance(inbox.next(), WorkLost)  # the third, ended by its lease
    assert len(runner.spawned) == 4


@pytest.mark.timeout(40)
def test_a_casts_next_command_waits_no_longer_than_the_given_up_one_can_run(runtime_factory, project, monkeypatch):
    """A runner stuck on a given-up command for ever (Ray's stream once hung so) must not hold the
    cast for ever: past that command's own deadline and a grace, the next one starts, with a warning."""
    from castor.actors.materia import utility_pool
    from castor.actors.materia.messages import UtilityJob
    from castor.actors.materia.utility_pool import cancel_utility, submit_utility

    monkeypatch.setattr(utility_pool, "GIVEN_UP_GRACE_S", 0.5)
    registry, runner, run_dir, inbox = _two_slots_whose_commands_run_cut_off(runtime_factory, project)

    def job(visit_id: str) -> UtilityJob:
        plain = _job(visit_id, ["true"], project, inbox)
        return UtilityJob(effect=plain.effect.model_copy(update={"timeout_ms": 200}), cast=inbox, run_dir=str(run_dir))

    submit_utility(registry, job("c1:Socket-1:1:1"))
    wait_for(lambda: len(runner.spawned) == 1, what="the first command to start")
    cancel_utility(registry, "c1:Socket-1:1:1")
    submit_utility(registry, job("c1:Socket-1:2:2"))
    wait_for(lambda: len(runner.spawned) == 2, timeout=10, what="the next command, past the first one's deadline")
    runner.lapse.set()
    assert {type(inbox.next()).__name__, type(inbox.next()).__name__} == {"CastOutcome", "WorkLost"}


@pytest.mark.timeout(40)
def test_a_command_started_on_a_cluster_is_recorded_with_how_long_it_may_outlive_its_host(runtime_factory, project):
    """A cast host's command runs on another machine, out of reach of the records' kill: its record
    in the run directory says how long it may run on after its host is lost (its lease and margin),
    so a runtime taking the cast up holds the cast's commands that long
    (``command_records.cluster_fence_s``). A local command's record says nothing of the kind."""
    from castor.actors.materia.messages import UtilityJob
    from castor.actors.materia.utility_pool import submit_utility
    from castor.adapters.materia.command_records import cluster_fence_s, record_path

    registry, runner, run_dir, inbox = _two_slots_whose_commands_run_cut_off(runtime_factory, project)
    plain = _job("c1:Socket-1:1:1", ["true"], project, inbox)
    submit_utility(registry, UtilityJob(effect=plain.effect, cast=inbox, run_dir=str(run_dir)))
    wait_for(lambda: len(runner.spawned) == 1, what="the command to start")
    record = json.loads(record_path(run_dir, "c1:Socket-1:1:1").read_text())
    assert record == {"visit_id": "c1:Socket-1:1:1", "clusterFenceS": 4.0}, record
    assert cluster_fence_s(run_dir, "c1") == 4.0 and cluster_fence_s(run_dir, "c2") == 0.0
    runner.lapse.set()
    inbox.next()
    assert cluster_fence_s(run_dir, "c1") == 0.0  # ended with an outcome: nothing may run on


@pytest.mark.timeout(30)
def test_metrics_count_the_utility_commands_running_now(runtime_factory, project):
    """``castor_utility_running`` is the commands running now: 1 while a cast's command runs, 0
    once an abort ended it (``castor_utility_runs_total`` counts only finished ones)."""
    from castor.console.metrics import metrics_text

    def running() -> float:
        line = next(line for line in metrics_text(rt).decode().splitlines()
                    if line.startswith("castor_utility_running "))
        return float(line.split()[1])

    pid_file = project / "util.pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    write_project_config(project, _config([sys.executable, "-c", code], timeout_ms=60000))
    rt = runtime_factory()
    open_session(rt, "s1", project, ["greeted"])
    assert running() == 0
    started = materia_call(rt, "s1", "start", {"request": "wait"})
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the command running"))
    assert wait_for(lambda: running() == 1, timeout=5, what="the running command counted")
    materia_call(rt, "s1", "abort", {"cast_id": started["cast_id"]})
    wait_for(lambda: not _alive(pid), timeout=5, what="the command to end")
    assert wait_for(lambda: running() == 0, timeout=5, what="the ended command no longer counted")
