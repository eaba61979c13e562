"""The materia CLI against careless or hostile input: typed one-line errors, no tracebacks,
nothing written or read outside the project, no command left running after the CLI ends."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.processes import process_gone
from tests.support.waiting import poll_until, wait_for

REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
            "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}


def _castor(tmp_path: Path, *args: str | bytes, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=cwd, env=_env(tmp_path), text=True,
                          errors="backslashreplace", capture_output=True, timeout=timeout)


def _project(tmp_path: Path, config: dict, answers: list | None = None) -> Path:
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    (project / "answers.json").write_text(json.dumps(answers if answers is not None else ["hi"]))
    return project


def _one_clean_error_line(result: subprocess.CompletedProcess[str], code: str) -> None:
    assert result.returncode not in (0, None), result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"castor: {code}: "), result.stderr


HELLO = {"activeLoadout": "hello"}


@pytest.mark.timeout(90)
def test_undecodable_request_bytes_and_escaped_surrogates_complete_without_a_crash(tmp_path):
    """An argv byte that is not UTF-8 and model / utility output escaping a lone surrogate each
    used to crash the CastActor on every restart (and re-run the utility each time)."""
    counter = tmp_path / "runs.txt"
    config = {"activeLoadout": "L", "loadouts": {"L": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "greeter", "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "utility", "parse": "json", "assign": {"odd": "$.a"},
                     "command": ["sh", "-c", f"echo run >> {counter}; printf '{{\"a\":\"\\\\ud800\"}}'"]}}}}}
    project = _project(tmp_path, config)
    (project / "answers.json").write_text('["model says \\ud800 here"]')  # the JSON escape itself
    result = _castor(tmp_path, "cast", b"bad \xff request", "--quiet", "--agent", "script:answers.json", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "complete" in result.stdout
    assert counter.read_text().splitlines() == ["run"]  # the utility ran exactly once
    (run_dir,) = [p for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
    state = json.loads((run_dir / "state.json").read_text())["state"]
    assert state["request"] == "bad \ufffd request" and state["data"]["odd"] == "\ufffd"
    assert "model says \ufffd here" in (run_dir / "sockets" / "Socket-1" / "1.md").read_text()


@pytest.mark.timeout(60)
def test_an_artifact_root_that_is_a_file_is_one_typed_error_line(tmp_path):
    project = _project(tmp_path, HELLO)
    (project / ".pi" / "pi-materia").write_text("in the way")
    result = _castor(tmp_path, "cast", "x", "--quiet", "--agent", "script:answers.json", cwd=project)
    _one_clean_error_line(result, "conflict")
    assert (project / ".pi" / "pi-materia").read_text() == "in the way"


@pytest.mark.timeout(60)
def test_casts_and_status_refuse_an_artifact_dir_outside_the_project_like_cast_does(tmp_path):
    outside = tmp_path / "elsewhere"
    (outside / "2026-01-01T00-00-00-000Z").mkdir(parents=True)
    project = _project(tmp_path, {"activeLoadout": "hello", "artifactDir": str(outside)})
    for args in (("casts",), ("status", "2026-01-01T00-00-00-000Z"),
                 ("cast", "x", "--quiet", "--agent", "script:answers.json")):
        _one_clean_error_line(_castor(tmp_path, *args, cwd=project), "forbidden")


def test_an_artifact_dir_a_link_leads_out_of_the_project_names_the_link_not_the_dir_it_suggests(tmp_path):
    # .pi shared between checkouts by a link: the default artifactDir ".pi/pi-materia" leads out
    # through it; the refusal suggested ".pi/pi-materia" -- the very value it refused
    shared = tmp_path / "shared-pi"
    shared.mkdir()
    project = tmp_path / "project"
    project.mkdir()
    (project / ".pi").symlink_to(shared)
    (project / "answers.json").write_text(json.dumps(["hi"]))
    for args in (("casts",), ("cast", "x", "--quiet", "--agent", "script:answers.json")):
        result = _castor(tmp_path, *args, cwd=project)
        _one_clean_error_line(result, "forbidden")
        line = result.stderr.strip().splitlines()[-1]
        assert f"'.pi' is a symbolic link to {shared}" in line, line
        assert 'e.g. ".pi/pi-materia"' not in line, line
    assert list(shared.iterdir()) == []


@pytest.mark.timeout(90)
def test_a_cast_started_with_config_is_found_again_with_config(tmp_path):
    project = _project(tmp_path, HELLO)
    alt = project / "alt.json"
    alt.write_text(json.dumps({"artifactDir": "runs"}))
    started = _castor(tmp_path, "cast", "x", "--quiet", "--config", "alt.json", "--agent", "script:answers.json",
                      cwd=project)
    assert started.returncode == 0, started.stderr
    (run_dir,) = [p for p in (project / "runs").iterdir() if p.is_dir()]
    listed = _castor(tmp_path, "casts", "--config", "alt.json", "--json", cwd=project)
    assert [row["cast_id"] for row in json.loads(listed.stdout)] == [run_dir.name]
    status = _castor(tmp_path, "status", run_dir.name, "--config", "alt.json", "--json", cwd=project)
    assert json.loads(status.stdout)["status"] == "complete"
    recast = _castor(tmp_path, "recast", run_dir.name, "--config", "alt.json", "--agent", "script:answers.json",
                     cwd=project)
    _one_clean_error_line(recast, "conflict")  # found, and refused because it is complete
    assert "Unknown" not in recast.stderr
    assert f"{run_dir.name} is complete and cannot be recast" in recast.stderr  # the engine's (and pi-materia's) words


@pytest.mark.timeout(30)
def test_errors_with_control_characters_stay_on_one_line(tmp_path):
    project = _project(tmp_path, HELLO)
    result = _castor(tmp_path, "grid", "--loadout", "a\nINJECTED\x1b[31m", cwd=project)
    _one_clean_error_line(result, "invalid_config")
    assert len(result.stderr.strip().splitlines()) == 1 and "\x1b" not in result.stderr


@pytest.mark.timeout(90)
def test_a_project_path_with_a_line_break_is_printed_on_one_line(tmp_path):
    """A directory name may hold a line break: ``castor casts`` and ``castor status`` printed the
    path raw, so its second half read as a line of castor's own."""
    project = _project(tmp_path / "a\nFAKE: all casts deleted", HELLO)
    assert _castor(tmp_path, "cast", "x", "--quiet", "--agent", "script:answers.json", cwd=project).returncode == 0
    for verb in (("casts",), ("status", "latest")):
        out = _castor(tmp_path, *verb, cwd=project).stdout
        assert "a\\nFAKE: all casts deleted" in out
        assert not any(line.startswith("FAKE") for line in out.splitlines()), out


def _stubborn_utility_project(tmp_path: Path) -> Path:
    # The command ignores SIGINT and SIGTERM, has a grandchild and a double-forked orphan (no
    # longer anyone's descendant): only killing the tree and the tagged processes ends it.
    return _project(tmp_path, {"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "timeoutMs": 120_000,
                     "command": ["sh", "-c", "trap '' INT TERM; (sleep 97 &); sleep 97 & wait"]}}}}})


def _sleeping_descendants(pid: int) -> list[psutil.Process] | None:
    """The ``sleep`` processes under ``pid`` (None while there are none); a process that ends
    while it is looked at (a zombie, gone) is skipped, not an error.

    Matched by the program's name, not by "sleep" anywhere in the command line: the utility's
    own ``sh -c "trap ...; ... sleep ..."`` has it in its script, and matching that shell let a
    test signal it before it had run its ``trap`` (a flake seen in CI). A ``sleep`` the script
    started means every line before it has run."""
    found = []
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            if proc.name() == "sleep":
                found.append(proc)
        except psutil.Error:
            continue
    return found or None


def _start_cast(project: Path, tmp_path: Path, script: str = "answers.json") -> subprocess.Popen[str]:
    """``castor cast x`` in ``project`` as a child process (the test signals or kills it)."""
    return subprocess.Popen([sys.executable, "-m", "castor", "cast", "x", "--quiet", "--agent", f"script:{script}"],
                            cwd=project, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _end(proc: subprocess.Popen[str], marker: str) -> None:
    """However the test went: the CLI is gone, and so is every test process matching ``marker``."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    for leftover in _sleepers(marker):
        leftover.kill()


def _sleepers(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("sent", "exit_code"), [((signal.SIGTERM,), 143), ((signal.SIGTERM, signal.SIGTERM), 143),
                                                 ((signal.SIGHUP,), 129)],
                         ids=["sigterm", "sigterm-twice", "sighup"])
def test_a_stop_signal_ends_the_cli_with_its_utility_process_tree(tmp_path, sent, exit_code):
    """`timeout N castor cast ...` sends SIGTERM: the runtime shuts down and ends the running
    command's whole tree (the cast stays resumable); a second signal kills it at once. A closed
    terminal or a dropped ssh session (SIGHUP) killed ``castor cast`` outright and left the command's
    whole tree behind (it runs in a session of its own, so the hangup never reached it): a build or
    a test run went on with no owner. SIGHUP now stops the command as SIGTERM does (exit 129)."""
    project = _stubborn_utility_project(tmp_path)
    proc = _start_cast(project, tmp_path)
    try:
        tree = wait_for(lambda: _sleeping_descendants(proc.pid), timeout=30, what="the utility's grandchild")
        for signum in sent:
            proc.send_signal(signum)
        assert proc.wait(30) == exit_code, proc.stderr.read() if proc.stderr else ""
        for child in tree:
            assert poll_until(lambda pid=child.pid: process_gone(pid), timeout=10), \
                f"utility process {child.pid} left running"
        assert poll_until(lambda: all(process_gone(p.pid) for p in _sleepers("sleep 97")), timeout=10), \
            "the double-forked orphan was left running"
    finally:
        _end(proc, "sleep 97")
    listed = _castor(tmp_path, "casts", "--json", cwd=project)
    assert [row["resumable"] for row in json.loads(listed.stdout)] == [True]


@pytest.mark.timeout(30)
def test_recast_of_an_unknown_cast_says_not_found_before_asking_for_an_agent(tmp_path):
    project = _project(tmp_path, HELLO)
    _one_clean_error_line(_castor(tmp_path, "recast", "2026-01-01T00-00-00-000Z", cwd=project), "not_found")


@pytest.mark.timeout(90)
def test_loadout_set_is_refused_while_another_process_runs_a_cast_and_an_empty_name_is_an_error(tmp_path):
    project = _project(tmp_path, HELLO)
    (project / "slow.json").write_text(json.dumps([{"text": "late", "delay_ms": 60_000}]))
    proc = _start_cast(project, tmp_path, "slow.json")
    try:
        wait_for(lambda: list((project / ".pi" / "pi-materia").glob("*/state.json")) or None, timeout=30,
                 what="the cast to start")
        _one_clean_error_line(_castor(tmp_path, "loadout", "plan", cwd=project), "conflict")
        assert json.loads((project / ".pi" / "pi-materia.json").read_text())["activeLoadout"] == "hello"
    finally:
        proc.kill()
        proc.wait(10)
    _one_clean_error_line(_castor(tmp_path, "loadout", "", cwd=project), "invalid_config")
    changed = _castor(tmp_path, "loadout", "plan", cwd=project)  # its runtime is gone: the cast is orphaned
    assert changed.returncode == 0, changed.stderr


@pytest.mark.timeout(60)
def test_the_first_sigterm_reaches_the_running_command_and_no_record_is_left(tmp_path):
    """Shutdown ends a running command gently (SIGTERM first, SIGKILL after a grace), and the
    command's record in the run dir goes with it. (The command loops on ``wait``: the group's
    SIGTERM may end ``sleep`` first, and a script that then simply ended could exit before its
    shell ran the pending trap; the loop makes the shell run it before its next command.)"""
    marker = tmp_path / "got-term"
    project = _project(tmp_path, {"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "timeoutMs": 120_000,
                     "command": ["sh", "-c", f"trap 'echo TERM > {marker}; exit 0' TERM; "
                                 "while :; do sleep 96 & wait; done"]}}}}})
    proc = _start_cast(project, tmp_path)
    try:
        wait_for(lambda: list((project / ".pi" / "pi-materia").glob("*/.commands/*.json")) or None, timeout=30,
                 what="the running command's record")
        wait_for(lambda: _sleeping_descendants(proc.pid), timeout=30, what="the command")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
    finally:
        _end(proc, "sleep 96")
    assert marker.read_text().strip() == "TERM"
    assert not list((project / ".pi" / "pi-materia").glob("*/.commands/*.json"))


INTERRUPTED_VERB = r"""
import os, signal, sys, threading
import castor.actors.materia.api as api
from castor.cli.app import main

real = api.materia_call
seen = {}


def interrupted_start(runtime, session_id, verb, params):
    if verb == "start" and "thread" not in seen:
        seen["thread"] = threading.current_thread().name
        os.kill(os.getpid(), signal.SIGNAL_NAME)  # arrives while the session's verb runs
        threading.Event().wait(0.3)  # the verb is busy meanwhile (a main thread would take the signal here)
        seen["verb_done"] = True
    return real(runtime, session_id, verb, params)


api.materia_call = interrupted_start
rc = main(["cast", "an interrupted start", "--agent", "script:answers.json", "--quiet"])
print("SEEN", seen.get("thread"), seen.get("verb_done"), file=sys.stderr)
sys.exit(rc)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signame, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_while_a_verb_runs_is_the_commands_never_an_actor_crash(tmp_path, signame, code):
    """A session verb and a cast's first incarnation run on the thread that asks. Asked from the
    main thread, Ctrl-C or SIGTERM landed inside actor code: logged as an actor crash, the actor
    restarted, the cast ran to its end and the command exited 0 (or actor_crashed, 1). The CLI asks
    from a worker thread; the signal ends the command (130 / 143, one line) and the cast stays
    resumable."""
    project = _project(tmp_path, {"activeLoadout": "T", "loadouts": {"T": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "greeter", "edges": [{"when": "always", "to": "Socket-2"}]},
        "Socket-2": {"type": "agent", "materia": "greeter"}}}}}, answers=[{"text": "one", "delay_ms": 2000}, "two"])
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_VERB.replace("SIGNAL_NAME", signame)], cwd=project,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                          capture_output=True, text=True, timeout=45)
    assert done.returncode == code, done.stderr
    assert "SEEN castor-cli-runtime" in done.stderr and "True" in done.stderr.splitlines()[-1], done.stderr
    assert "Traceback" not in done.stderr and "crashed" not in done.stderr, done.stderr
    assert "castor: interrupted" in done.stderr
    listed = json.loads(_castor(tmp_path, "casts", "--json", cwd=project).stdout)
    # The runtime shut down while the verb still ran: the cast never started, or it stopped where
    # it was (its first turn takes 2 s) and can be recast.
    assert all(cast["status"] != "complete" and cast["resumable"] for cast in listed), listed


TWO_AGENT_SOCKETS = {"activeLoadout": "T", "loadouts": {"T": {"entry": "Socket-1", "sockets": {
    "Socket-1": {"type": "agent", "materia": "greeter", "edges": [{"when": "always", "to": "Socket-2"}]},
    "Socket-2": {"type": "agent", "materia": "greeter"}}}}}


def _interrupted_cast(tmp_path: Path) -> tuple[Path, str]:
    """A cast whose first turn was Esc'd (interrupted: active, resumable with continue)."""
    project = _project(tmp_path, TWO_AGENT_SOCKETS, answers=[{"text": "partial", "stop_reason": "aborted"}])
    done = _castor(tmp_path, "cast", "x", "--agent", "script:answers.json", "--quiet", cwd=project)
    (cast,) = json.loads(_castor(tmp_path, "casts", "--json", cwd=project).stdout)
    assert cast["status"] == "interrupted", (done.stderr, cast)
    return project, cast["cast_id"]


@pytest.mark.timeout(60)
def test_an_abort_left_from_before_does_not_abort_the_next_recast(tmp_path):
    """An abort request a killed `castor abort` left behind is not for the next holder: the recast
    removes it and runs on (it used to abort itself on its first poll)."""
    project, cast_id = _interrupted_cast(tmp_path)
    request = project / ".pi" / "pi-materia" / cast_id / "abort.request"
    request.write_text(json.dumps({"requested_at": 1.0, "pid": 1}))
    (project / "answers.json").write_text(json.dumps([{"text": "one", "delay_ms": 600}, "two"]))  # polled mid-turn
    done = _castor(tmp_path, "continue", cast_id, "--agent", "script:answers.json", "--quiet", cwd=project)
    assert done.returncode == 0, done.stderr
    assert not request.exists() and f"abort request {request} was left from before" in done.stderr
    assert json.loads(_castor(tmp_path, "status", cast_id, "--json", cwd=project).stdout)["status"] == "complete"


def _plant_abort_request(request: Path, how: str) -> None:
    if how == "no_timestamp":
        request.write_text(json.dumps({"pid": 1}))
    elif how == "not_json":
        request.write_text("abort")
    elif how == "future":
        request.write_text(json.dumps({"requested_at": 4102444800.0, "pid": 1}))  # 2100-01-01
    elif how == "link":
        (request.parent.parent / "elsewhere.json").write_text(json.dumps({"requested_at": 4102444800.0}))
        request.symlink_to(request.parent.parent / "elsewhere.json")
    elif how == "empty_directory":
        request.mkdir()
    else:  # a directory as a checkout ships it: git keeps no empty one
        request.mkdir()
        (request / "README").write_text("x")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["no_timestamp", "not_json", "future", "link", "empty_directory", "directory"])
def test_an_abort_request_a_checkout_ships_never_aborts_the_recast(tmp_path, how):
    """A project checkout can carry a run directory's ``abort.request``: one with no readable
    timestamp, a link or a directory in its place was applied as an abort, so the user's next
    recast aborted itself on its first poll. Only a request made while this command holds the cast
    is applied; anything else is named in a warning and removed (a directory with something in it
    is left for the user to remove), and the recast completes."""
    project, cast_id = _interrupted_cast(tmp_path)
    request = project / ".pi" / "pi-materia" / cast_id / "abort.request"
    _plant_abort_request(request, how)
    (project / "answers.json").write_text(json.dumps([{"text": "one", "delay_ms": 600}, "two"]))  # polled mid-turn
    done = _castor(tmp_path, "recast", cast_id, "--agent", "script:answers.json", "--quiet", cwd=project)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert json.loads(_castor(tmp_path, "status", cast_id, "--json", cwd=project).stdout)["status"] == "complete"
    warnings = [line for line in done.stderr.splitlines() if str(request) in line]
    assert len(warnings) == 1 and "not applied" in warnings[0], done.stderr
    assert os.path.lexists(request) == (how == "directory")


LOSES_THE_RACE = r"""
import sys
from castor.adapters.materia.cast_lease import CastLease
from castor.cli.app import main

CastLease.is_held = staticmethod(lambda *a, **k: False)  # the check ran just before the other CLI took it
sys.exit(main(["abort", sys.argv[1]]))
"""


@pytest.mark.timeout(60)
def test_an_abort_that_loses_the_race_to_a_continue_still_aborts(tmp_path):
    """`castor abort` found the cast free, and a `castor continue` took it the next moment: the
    abort's own take is refused (held elsewhere), and it falls back to asking the holder."""
    project, cast_id = _interrupted_cast(tmp_path)
    (project / "answers.json").write_text(json.dumps([{"text": "slow", "delay_ms": 20000}, "two"]))
    holder = subprocess.Popen([sys.executable, "-m", "castor", "continue", cast_id, "--quiet", "--agent",
                               "script:answers.json"], cwd=project, env=_env(tmp_path), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        from castor.adapters.materia.cast_lease import CastLease

        root = project / ".pi" / "pi-materia"
        wait_for(lambda: CastLease.is_held(root, cast_id) or None, timeout=30, what="the continue to hold the cast")
        aborted = subprocess.run([sys.executable, "-c", LOSES_THE_RACE, cast_id], cwd=project, env=_env(tmp_path),
                                 capture_output=True, text=True, timeout=45)
        assert aborted.returncode == 0, aborted.stderr
        assert f"pi-materia cast {cast_id} aborted" in aborted.stdout
        assert holder.wait(30) == 1  # the continue ends with its cast: aborted
        assert not (root / cast_id / "abort.request").exists()
    finally:
        _end(holder, "never")
    assert json.loads(_castor(tmp_path, "status", cast_id, "--json", cwd=project).stdout)["status"] == "aborted"


@pytest.mark.timeout(60)
def test_a_damaged_state_file_is_state_corrupt_never_internal(tmp_path):
    """`internal` means a bug of castor's; a state.json emptied, truncated or written by something
    else is the data's fault: a stable code of its own, one line, for every command that reads it."""
    project, cast_id = _interrupted_cast(tmp_path)
    state = project / ".pi" / "pi-materia" / cast_id / "state.json"
    for content in ("", "{", "{}", "null", '{"version": 999}'):
        state.write_text(content)
        _one_clean_error_line(_castor(tmp_path, "status", cast_id, cwd=project), "state_corrupt")
    for verb in ("abort", "recast"):  # the verbs that would take the cast in: the same answer
        args = [verb, cast_id] + (["--agent", "script:answers.json"] if verb == "recast" else [])
        _one_clean_error_line(_castor(tmp_path, *args, cwd=project), "state_corrupt")
    listed = json.loads(_castor(tmp_path, "casts", "--json", cwd=project).stdout)
    assert [row["status"] for row in listed] == ["unreadable"]


def test_a_cast_its_runtime_stopped_mid_run_ends_with_a_reason_and_the_recast_hint(capsys):
    """A disk that filled mid-turn stops the cast (orphaned): the CLI said "orphaned: orphaned",
    with neither what happened nor how to go on."""
    from castor.cli.materia import EXIT_FAILED, _finish

    assert _finish({"cast_id": "c-1", "status": "orphaned", "current_socket": "Socket-2"}, "") == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "orphaned: orphaned" not in err
    assert "stopped at socket Socket-2" in err and "`castor recast c-1` resumes it" in err


def test_a_config_that_is_a_directory_and_a_script_that_is_not_utf8_are_named_clearly(tmp_path):
    project = _project(tmp_path, TWO_AGENT_SOCKETS)
    (project / "adir").mkdir()
    shown = _castor(tmp_path, "validate", "adir", cwd=project)
    assert shown.returncode != 0 and "a directory" in shown.stdout + shown.stderr
    assert "Is a directory: 3" not in shown.stdout + shown.stderr  # the fd's number, not the path
    (project / "u16.json").write_bytes("[\"x\"]".encode("utf-16"))
    done = _castor(tmp_path, "cast", "x", "--agent", "script:u16.json", cwd=project)
    _one_clean_error_line(done, "invalid_config")
    assert "u16.json" in done.stderr and "not UTF-8" in done.stderr



@pytest.mark.timeout(90)
def test_ctrl_c_while_a_cast_runs_names_the_cast_and_how_to_go_on(tmp_path):
    """It printed only "castor: interrupted"; the cast's id and the command that resumes it were
    to be found with castor casts."""
    project = _project(tmp_path, TWO_AGENT_SOCKETS, answers=[{"text": "one", "delay_ms": 20_000}, "two"])
    env = {**_env(tmp_path), "PYTHONFAULTHANDLER": "1"}  # a hang below prints every thread's stack
    proc = subprocess.Popen([sys.executable, "-m", "castor", "cast", "go", "--agent", "script:answers.json",
                             "--quiet"], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        started = proc.stdout.readline()
        cast_id = started.split()[1]
        assert started.startswith(f"cast {cast_id} started"), started
        proc.send_signal(signal.SIGINT)
        try:
            _out, err = proc.communicate(timeout=45)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler: the stacks, into the failure's text
            _out, err = proc.communicate(timeout=10)
            pytest.fail(f"the CLI did not end after Ctrl-C; its threads:\n{err[-8000:]}")
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert f"castor: cast {cast_id} stopped before it ended; it stays resumable: castor continue {cast_id}" in err
    assert "Traceback" not in err


def _cast_in_its_turn(tmp_path: Path, project: Path,
                      context: str | None = None) -> tuple[subprocess.Popen[str], str, Path]:
    """``castor cast go`` started in ``project``, once the turn whose context file is ``context``
    (the first turn, if None) has been asked for: the process, the cast's id and run directory."""
    proc = subprocess.Popen([sys.executable, "-m", "castor", "cast", "go", "--agent", "script:answers.json",
                             "--quiet"], cwd=project, env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        cast_id = proc.stdout.readline().split()[1]
        run_dir = project / ".pi" / "pi-materia" / cast_id
        contexts = run_dir / "contexts"
        wait_for(lambda: (contexts / context).exists() if context else contexts.is_dir() and any(contexts.iterdir()),
                 timeout=30, what=f"the turn of {context or 'the first socket'} to be asked for")
    except BaseException:
        proc.kill()
        proc.communicate(timeout=10)
        raise
    return proc, cast_id, run_dir


@pytest.mark.timeout(90)
@pytest.mark.parametrize("damage", ["manifest-not-json", "state-a-directory", "run-dir-removed"])
def test_a_run_directory_damaged_mid_turn_stops_the_cast_with_a_typed_error(tmp_path, damage):
    """A told turn outcome whose save or file effects met a damaged run directory was only logged:
    the CLI waited for ever (a manifest made invalid, state.json made a directory), or the cast's
    restart started it over in a recreated directory without its lease (the directory removed)."""
    import shutil

    project = _project(tmp_path, TWO_AGENT_SOCKETS, answers=[{"text": "one", "delay_ms": 2500}, "two"])
    proc, cast_id, run_dir = _cast_in_its_turn(tmp_path, project)
    try:
        if damage == "manifest-not-json":
            (run_dir / "manifest.json").write_text("notjson")
        elif damage == "state-a-directory":
            (run_dir / "state.json").unlink()
            (run_dir / "state.json").mkdir()
        else:
            # The cast may still be adding a file of its first transition (its first effects run on
            # its own thread once its start is answered): rm -rf then meets a directory not empty,
            # and a user runs it again; or a temp file it listed was renamed away before rm -rf
            # reached it (ENOENT on that file), and again a user runs it again.
            def removed() -> bool:
                try:
                    shutil.rmtree(run_dir)
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.ENOENT):
                        raise
                    return not run_dir.exists()
                return True

            wait_for(removed, timeout=10, what="the run directory removed")
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    if damage != "run-dir-removed":
        assert "state_corrupt" in err and f"castor recast {cast_id}" in err, err
    else:
        assert not run_dir.exists(), "the cast was started over in a recreated directory"


BUILD_ANSWERS = [
    {"key": "Socket-3", "text": json.dumps({"workItems": [{"id": "w1", "title": "Parser"}]})},
    {"key": "Socket-4/w1", "text": "Built the parser.", "delay_ms": 0},
    {"key": "Socket-5/w1", "text": json.dumps({"satisfied": True})},
    "Summary: the parser is built.",
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("manifest", [b'{"entries": [', b"", b"\xff\xfe not utf-8"],
                         ids=["truncated", "empty", "binary"])
def test_a_recast_over_a_damaged_manifest_is_one_state_corrupt_line(tmp_path, manifest):
    """It crash-looped (six tracebacks) and ended ``actor_stopped``."""
    slow = [dict(a, delay_ms=600_000) if isinstance(a, dict) and a["key"] == "Socket-4/w1" else a
            for a in BUILD_ANSWERS]
    project = _project(tmp_path, {}, answers=slow)
    (project / "fast.json").write_text(json.dumps(BUILD_ANSWERS))
    proc, cast_id, run_dir = _cast_in_its_turn(tmp_path, project, "Socket-4-w1-1.md")
    proc.kill()
    proc.communicate(timeout=10)
    (run_dir / "manifest.json").write_bytes(manifest)
    done = _castor(tmp_path, "recast", cast_id, "--agent", "script:fast.json", "--quiet", cwd=project)
    _one_clean_error_line(done, "state_corrupt")
    assert "manifest.json" in done.stderr


STATUS_UNREADABLE = r"""
import sys
import castor.actors.materia.api as api
from castor.cli.app import main
from castor.messages.errors import StorageUnavailable

real = api.materia_call
polls = {"n": 0}


def refused_status(runtime, session_id, verb, params):  # the storage refuses the command's status reads
    if verb == "status":
        polls["n"] += 1
        if polls["n"] > 3:
            raise StorageUnavailable("storage unavailable: cannot run materia status on "
                                     ".pi/pi-materia/X/state.json (EACCES: Permission denied)",
                                     data={"errno": "EACCES", "path": ".pi/pi-materia/X/state.json"})
    return real(runtime, session_id, verb, params)


api.materia_call = refused_status
sys.exit(main(["cast", "go", "--agent", "script:answers.json", "--quiet"]))
"""


@pytest.mark.timeout(90)
def test_a_storage_fault_of_the_commands_own_status_poll_names_the_cast_and_the_recast(tmp_path):
    """`castor cast` whose status poll met a storage fault (a state.json it may no longer read)
    ended with the error line alone: the cast it left resumable was named nowhere, nor the command
    that resumes it. A line before the error names both."""
    project = _project(tmp_path, TWO_AGENT_SOCKETS, answers=[{"text": "one", "delay_ms": 1500}, "two"])
    done = subprocess.run([sys.executable, "-c", STATUS_UNREADABLE], cwd=project, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    _one_clean_error_line(done, "storage_unavailable")
    cast_id = done.stdout.split()[1]
    assert done.stdout.startswith(f"cast {cast_id} started"), done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) >= 2 and "EACCES" in lines[-1], lines
    assert lines[-2] == (f"castor: cast {cast_id} stopped before it ended; once the storage is fixed, "
                         f"`castor recast {cast_id}` resumes it"), lines
    recast = _castor(tmp_path, "recast", cast_id, "--agent", "script:answers.json", "--quiet", cwd=project)
    assert recast.returncode == 0, recast.stderr
    assert json.loads(_castor(tmp_path, "casts", "--json", cwd=project).stdout)[0]["status"] == "complete"


INTERRUPTED_AS_IT_ENDS = r"""
import os, signal, sys, threading
import castor.cli.materia as cli
from castor.cli.app import main


def interrupted_finish(view, flags, agent_flags=""):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C as the cast's end is reported
    threading.Event().wait(10)  # the handler raises here
    raise AssertionError("no KeyboardInterrupt")


cli._finish = interrupted_finish
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ended, said", [
    ("complete", "ended complete before the interrupt took effect"),
    ("failed", "ended failed before the interrupt took effect: Utility command failed"),
])
def test_ctrl_c_as_the_cast_ends_names_its_real_end_not_a_resume_that_would_be_refused(tmp_path, ended, said):
    """A Ctrl-C that lands once the cast has ended (or while the runtime shuts down, as its last
    turn's end is saved) printed "stopped before it ended; it stays resumable: castor continue ID",
    a command castor then refuses ("is complete and cannot be continued"). The line says how the
    cast really ended, read after the runtime stopped; the exit status is still the signal's."""
    command = ["sh", "-c", "exit 0" if ended == "complete" else "exit 3"]
    project = _project(tmp_path, {"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "command": command}}}}})
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_AS_IT_ENDS, "cast", "x", "--agent",
                           "script:answers.json", "--quiet"], cwd=project, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    (cast,) = json.loads(_castor(tmp_path, "casts", "--json", cwd=project).stdout)
    assert cast["status"] == ended, cast
    assert "stays resumable" not in done.stderr, done.stderr
    assert f"castor: cast {cast['cast_id']} {said}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.rstrip().endswith("castor: interrupted"), done.stderr


INTERRUPTED_AFTER_THE_START = r"""
import os, signal, sys, threading
import castor.actors.materia.api as api
from castor.cli.app import main

real = api.materia_call


def start_then_interrupted(runtime, session_id, verb, params):
    answer = real(runtime, session_id, verb, params)
    if verb == "start":  # the cast exists; its id has not reached the command yet
        os.kill(os.getpid(), signal.SIGNAL_NAME)
        threading.Event().wait(0.5)
    return answer


api.materia_call = start_then_interrupted
sys.exit(main(["cast", "go", "--agent", "script:answers.json", "--quiet"]))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signame, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_during_the_casts_start_still_names_the_cast_it_leaves(tmp_path, signame, code):
    """A Ctrl-C (or SIGTERM) while ``castor cast`` waits for its start verb, after the cast was
    made: the command printed "castor: interrupted" alone, and the cast -- orphaned, resumable --
    was named nowhere (no ``started`` line). The command finds the cast it started (its run
    directory's ``cli.json`` carries the command's mark) and names it and how to go on."""
    project = _project(tmp_path, TWO_AGENT_SOCKETS, answers=[{"text": "one", "delay_ms": 5000}, "two"])
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_AFTER_THE_START.replace("SIGNAL_NAME", signame)],
                          cwd=project, env=_env(tmp_path), capture_output=True, text=True, timeout=45)
    assert done.returncode == code, done.stderr
    (cast,) = json.loads(_castor(tmp_path, "casts", "--json", cwd=project).stdout)
    assert cast["resumable"] and cast["status"] != "complete", cast
    cast_id = cast["cast_id"]
    assert (f"castor: cast {cast_id} stopped before it ended; it stays resumable: castor continue {cast_id}"
            in done.stderr), done.stderr
    assert "Traceback" not in done.stderr and done.stderr.rstrip().endswith("castor: interrupted"), done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("sent", "exit_code"), [(signal.SIGHUP, 129), (signal.SIGTERM, 143)],
                         ids=["sighup", "sigterm"])
def test_a_stop_signal_after_the_terminal_is_gone_still_exits_with_the_signals_status(tmp_path, sent, exit_code):
    """A closed terminal: SIGHUP comes, and stderr's reader is gone (EIO on a hung-up terminal,
    EPIPE on a pipe). The lines naming the stopped cast could not be written, and that error made
    the command exit 1, as a failed cast does, instead of 129 (143 for SIGTERM); the command's tree
    is ended all the same and the cast stays resumable."""
    project = _project(tmp_path, {"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "utility", "timeoutMs": 120_000, "command": ["sleep", "95"]}}}}})
    reader, writer = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "castor", "cast", "x", "--quiet", "--agent", "script:answers.json"],
                            cwd=project, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=writer)
    os.close(writer)
    os.close(reader)  # nobody reads stderr any more
    try:
        tree = wait_for(lambda: _sleeping_descendants(proc.pid), timeout=30, what="the utility's command")
        proc.send_signal(sent)
        assert proc.wait(30) == exit_code
        for child in tree:
            assert poll_until(lambda pid=child.pid: process_gone(pid), timeout=10), "the command was left running"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    listed = _castor(tmp_path, "casts", "--json", cwd=project)
    assert [row["resumable"] for row in json.loads(listed.stdout)] == [True]


@pytest.mark.timeout(90)
def test_a_config_that_does_not_load_is_said_when_casts_are_looked_for_under_the_default(tmp_path):
    """``castor casts`` / ``status`` take ``--config`` to find casts written under its ``artifactDir``;
    one that does not load left them looking under the default in silence: "casts under
    …/.pi/pi-materia: none", exit 0, while the casts sat elsewhere. Now one warning line names the
    problem; the listing (still valid JSON with ``--json``) and the exit status are as before."""
    project = _project(tmp_path, HELLO)
    (project / "alt.json").write_text('{"artifactDir": "runs",')
    for args in (("casts", "--config", "alt.json", "--json"), ("status", "--config", "alt.json")):
        done = _castor(tmp_path, *args, cwd=project)
        warning = [line for line in done.stderr.splitlines() if line.startswith("castor: warning: ")]
        assert len(warning) == 1, done.stderr
        assert "alt.json" in warning[0] and ".pi/pi-materia" in warning[0], warning
        if "--json" in args:
            assert done.returncode == 0 and json.loads(done.stdout) == []
    (project / ".pi" / "pi-materia.json").write_text('{"activeLoadout": ')  # the project's own layer
    done = _castor(tmp_path, "casts", cwd=project)
    assert done.returncode == 0 and "pi-materia.json" in done.stderr and "castor: warning: " in done.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["inside", "cwd_flag"])
def test_a_project_whose_path_is_not_utf8_is_refused_naming_it_and_what_to_do(tmp_path, how):
    """A project directory whose name is not UTF-8 (a byte 0xff): ``castor cast`` there answered
    ``invalid_params`` "invalid input for materia start: 'utf-8' codec can't encode characters in
    position 42-43: surrogates not allowed" -- Python's words, naming neither the directory nor a
    way on. A cast's state and events hold its paths as UTF-8 JSON: the command refuses before it
    starts, naming the directory, the byte, and the rename that lets a cast run there."""
    project = _project(tmp_path, HELLO)
    odd = tmp_path / os.fsdecode(b"proj\xff")
    project.rename(odd)
    args = ("--cwd", str(odd)) if how == "cwd_flag" else ()
    result = _castor(tmp_path, "cast", "hi", "--quiet", "--agent", f"script:{odd / 'answers.json'}", *args,
                     cwd=odd if how == "inside" else tmp_path)
    _one_clean_error_line(result, "invalid_params")
    last = result.stderr.strip().splitlines()[-1]
    assert "proj\\udcff" in last and "not UTF-8" in last and "byte 0xff" in last and "rename" in last, last
    assert "codec" not in result.stderr, result.stderr
    assert not (odd / ".pi" / "pi-materia").exists()  # nothing started
    listed = _castor(tmp_path, "casts", cwd=odd)  # what reads the project still works there
    assert listed.returncode == 0, listed.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("verb", ["recast", "continue"])
def test_a_resume_of_a_cast_another_process_holds_names_the_commands_that_help(tmp_path, verb):
    """Two ``castor recast`` of one cast at once: the one that lost answered ``conflict`` "pi-materia
    cast ID is running in another session or castor runtime." and stopped there. It names what to
    type: ``castor status ID`` (where it runs) and ``castor abort ID`` (to stop it first)."""
    from castor.adapters.materia.cast_lease import CastLease

    project, cast_id = _interrupted_cast(tmp_path)
    root = project / ".pi" / "pi-materia"
    lease = CastLease.try_acquire(root, cast_id)  # another process's runtime holds it
    assert lease is not None
    try:
        (project / "answers.json").write_text(json.dumps(["two"]))
        refused = _castor(tmp_path, verb, cast_id, "--agent", "script:answers.json", "--quiet", cwd=project)
    finally:
        lease.release()
    _one_clean_error_line(refused, "conflict")
    last = refused.stderr.strip().splitlines()[-1]
    assert f"castor status {cast_id}" in last and f"castor abort {cast_id}" in last, last


OVER_THE_STATE_BOUND = r"""
import sys
import castor.adapters.materia.state_store as store
from castor.cli.app import main

store.MAX_STATE_BYTES = int(sys.argv[2])  # castor's bound, small: a cast's state grown past it
sys.exit(main(["recast", sys.argv[1], "--agent", "script:answers.json", "--quiet"]))
"""


def _recast_past_the_state_bound(tmp_path: Path) -> tuple[Path, str, subprocess.CompletedProcess]:
    """An interrupted cast whose state grew to 150 KB, recast under a 200,000-byte state bound: it
    stops on ``storage_unavailable`` (one clean error line). ``(project, cast id, that recast)``."""
    project, cast_id = _interrupted_cast(tmp_path)
    state = project / ".pi" / "pi-materia" / cast_id / "state.json"
    document = json.loads(state.read_text())
    document["state"]["data"]["grown"] = "x" * 150_000
    state.write_text(json.dumps(document))
    (project / "answers.json").write_text(json.dumps(["two"]))
    refused = subprocess.run([sys.executable, "-c", OVER_THE_STATE_BOUND, cast_id, "200000"], cwd=project,
                             env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    _one_clean_error_line(refused, "storage_unavailable")
    return project, cast_id, refused


@pytest.mark.timeout(90)
def test_a_cast_whose_state_outgrew_castors_bound_says_so_not_free_space(tmp_path):
    """A cast's state grown past the bound castor saves (``MAX_STATE_BYTES``; here made small): the
    recast stopped with "storage unavailable ... (EFBIG: a state document of N bytes is over
    castor's bound). Free space (or fix the storage), then castor recast ID" -- no space freed lets
    that state be saved, so the recast it advised met the same bound. It says the state outgrew
    castor's bound, that recasting cannot help, and what starts anew."""
    project, cast_id, refused = _recast_past_the_state_bound(tmp_path)
    assert "Free space" not in refused.stderr and "once the storage is fixed" not in refused.stderr, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert "castor's 200000-byte bound" in last and "castor cast" in last, last
    assert f"castor recast {cast_id}" not in refused.stderr, refused.stderr


@pytest.mark.timeout(120)
def test_a_cast_whose_state_outgrew_castors_bound_is_listed_as_no_recast_target(tmp_path):
    """Once a cast stopped on a state grown past castor's bound, ``castor status`` still said "stopped:
    storage unavailable ...; fix the storage ..., then castor recast ID" and "RECAST TARGET", ``castor
    casts`` listed it as a recast target (``resumable: true`` in its JSON, and so ``cast.list``) and
    an id-less ``castor recast`` picked it -- each a recast that stops at once on the same bound. They
    say what the stop said and what helps (``castor cast REQUEST`` starts a new cast)."""
    project, cast_id, refused = _recast_past_the_state_bound(tmp_path)

    status = _castor(tmp_path, "status", cast_id, cwd=project)
    assert status.returncode == 0, status.stderr
    assert "castor recast" not in status.stdout and "castor continue" not in status.stdout, status.stdout
    assert "castor's 200000-byte bound" in status.stdout and "castor cast REQUEST" in status.stdout, status.stdout
    assert "another castor runtime" not in status.stdout, status.stdout  # nothing holds it
    view = json.loads(_castor(tmp_path, "status", cast_id, "--json", cwd=project).stdout)
    assert view["resumable"] is False and "200000-byte bound" in view["outgrown"]["message"], view

    listed = _castor(tmp_path, "casts", cwd=project)
    assert listed.returncode == 0, listed.stderr
    assert "RECAST TARGET" not in listed.stdout and "castor recast" not in listed.stdout, listed.stdout
    assert "castor continue" not in listed.stdout and "castor cast REQUEST" in listed.stdout, listed.stdout
    (row,) = json.loads(_castor(tmp_path, "casts", "--json", cwd=project).stdout)
    assert row["resumable"] is False and row["outgrown"], row

    picked = _castor(tmp_path, "recast", "--agent", "script:answers.json", "--quiet", cwd=project)
    _one_clean_error_line(picked, "not_found")  # none to recast: never the outgrown one


@pytest.mark.timeout(120)
def test_on_a_read_only_mount_every_cast_command_names_what_to_type_once_it_is_writable(tmp_path):
    """A project on a mount remounted read-only with a cast its killed runtime left: ``castor abort``
    answered "storage unavailable: cannot run materia abort on .../owner.lock (EROFS: Read-only file
    system)" and nothing more. Each command that must write says, on its error line, the command to
    type again once the storage is writable; what only reads (casts, status) still works."""
    from tests.support.tmpfs import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "mnt", "8m") as mount:
        project = _project(mount, TWO_AGENT_SOCKETS, answers=[{"text": "late", "delay_ms": 60_000}])
        proc = _start_cast(project, mount)
        try:
            wait_for(lambda: list((project / ".pi" / "pi-materia").glob("*/state.json")) or None, timeout=30,
                     what="the cast to start")
        finally:
            proc.kill()
            proc.wait(10)
        (cast_id,) = [p.name for p in (project / ".pi" / "pi-materia").iterdir() if p.is_dir()]
        assert subprocess.run(["mount", "-o", "remount,ro", str(mount)], capture_output=True).returncode == 0
        for verb in ("abort", "recast", "continue"):
            flags = () if verb == "abort" else ("--agent", "script:answers.json", "--quiet")
            refused = _castor(tmp_path, verb, cast_id, *flags, cwd=project)
            _one_clean_error_line(refused, "storage_unavailable")
            last = refused.stderr.strip().splitlines()[-1]
            assert "EROFS" in last and f"`castor {verb} {cast_id}`" in last, (verb, last)
        for verb in ("casts", "status"):
            assert _castor(tmp_path, verb, cwd=project).returncode == 0
