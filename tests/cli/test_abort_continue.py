"""The CLI at parity with the harness: ``castor abort`` / ``castor continue``, ids as a unique
prefix or ``latest``, messages naming ``castor`` commands, the scripted agent's documented file
and its answers found again by a recast. Each test drives ``python -m castor`` in a fresh project."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
            "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}


def castor(tmp_path: Path, *args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "castor", *args], cwd=cwd, env=_env(tmp_path), text=True,
                          capture_output=True, timeout=timeout)


def spawn(tmp_path: Path, *args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "castor", *args], cwd=cwd, env=_env(tmp_path), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def project(tmp_path: Path, answers: Any, config: dict | None = None) -> Path:
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    if config is not None:
        (root / ".pi" / "pi-materia.json").write_text(json.dumps(config))
    (root / "answers.json").write_text(json.dumps(answers))
    return root


def casts_dir(root: Path) -> Path:
    return root / ".pi" / "pi-materia"


def run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in casts_dir(root).iterdir() if p.is_dir()) if casts_dir(root).is_dir() else []


def state(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "state.json").read_text())["state"]


def state_or_none(run_dir: Path) -> dict[str, Any]:
    """The saved state, or {} while it is not written yet (the run directory comes first)."""
    try:
        return state(run_dir)
    except (OSError, ValueError, KeyError):
        return {}


def last_error(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def help_example() -> list[Any]:
    """The complete example file printed by ``castor cast --help``."""
    text = subprocess.run(
        [sys.executable, "-m", "castor", "cast", "--help"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        text=True,
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    start = text.index("\n  [\n") + 1
    return json.loads(text[start:text.index("\n  ]", start) + 4])


HELLO = {"activeLoadout": "hello"}


def build_answers(*, w2_delay_ms: int = 0) -> list[Any]:
    answers = help_example()
    for answer in answers:
        if isinstance(answer, dict) and answer.get("key") == "Socket-4/w2":
            answer["delay_ms"] = w2_delay_ms
    return answers


def outputs(run_dir: Path, socket: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((run_dir / "sockets" / socket).glob("*.md"))}


def wait_pending(run_dir: Path, socket: str, item: str) -> None:
    def there() -> bool:
        try:
            s = state(run_dir)
        except (OSError, ValueError, KeyError):
            return False
        pending = s.get("pending") or {}
        return pending.get("socket_id") == socket and s.get("current_item_key") == item
    wait_for(there, 60, f"{socket} {item} to be pending")


# ----------------------------------------------------------------------------- the scripted agent


@pytest.mark.timeout(90)
def test_the_help_example_is_a_complete_script_for_the_build_loadout(tmp_path) -> None:
    root = project(tmp_path, help_example())
    result = castor(tmp_path, "cast", "build two things", "--loadout", "build", "--agent", "script:answers.json",
                    "--quiet", cwd=root)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(root)
    assert outputs(run_dir, "Socket-4") == {"1-w1.md": "Built the parser.", "2-w2.md": "Built the CLI."}
    assert outputs(run_dir, "Socket-7") == {"1.md": "Summary: parser and CLI built."}


def cast_waiting_at_w2(tmp_path: Path, *, w2_delay_ms: int) -> tuple[Path, subprocess.Popen[str], Path]:
    """A ``castor cast`` of the build loadout in its own process, once it waits for work item w2's
    answer (delayed ``w2_delay_ms``): the project, the process and the run directory. The process
    is killed if it never gets there."""
    root = project(tmp_path, build_answers(w2_delay_ms=w2_delay_ms))
    proc = spawn(tmp_path, "cast", "build two things", "--loadout", "build", "--agent", "script:answers.json",
                 "--quiet", cwd=root)
    try:
        wait_for(lambda: run_dirs(root), 60, "the run directory")
        (run_dir,) = run_dirs(root)
        wait_pending(run_dir, "Socket-4", "w2")
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise
    return root, proc, run_dir


@pytest.mark.timeout(120)
def test_kill_9_at_work_item_w2_then_recast_latest_resumes_with_w2s_answer(tmp_path) -> None:
    root, proc, run_dir = cast_waiting_at_w2(tmp_path, w2_delay_ms=3000)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    listed = castor(tmp_path, "status", "latest", cwd=root)
    assert listed.returncode == 0 and "[orphaned]" in listed.stdout and "castor recast" in listed.stdout
    assert "/materia" not in listed.stdout
    # A new process, the same script: the turn it resumes at finds its own answer, not the file's first.
    result = castor(tmp_path, "recast", "latest", "--quiet", cwd=root, timeout=90)
    assert result.returncode == 0, result.stderr
    assert outputs(run_dir, "Socket-4") == {"1-w1.md": "Built the parser.", "2-w2.md": "Built the CLI."}
    assert state(run_dir)["phase"] == "complete"


@pytest.mark.timeout(60)
def test_a_scripted_failure_names_the_scripted_agent_not_pi(tmp_path) -> None:
    root = project(tmp_path, [{"error": "invalid api key", "text": "partial"}], HELLO)
    result = castor(tmp_path, "cast", "hi", "--agent", "script:answers.json", "--quiet", cwd=root)
    assert result.returncode == 1
    line = last_error(result)
    assert "Scripted agent (answers.json) turn failed" in line and "Pi agent" not in line
    assert "castor recast" in line


# ----------------------------------------------------------------------------- Esc and continue


@pytest.mark.timeout(90)
def test_an_interrupted_turn_stops_the_cli_and_castor_continue_reruns_it(tmp_path) -> None:
    root = project(tmp_path, [{"stop_reason": "aborted", "text": "CUT-OFF"}], HELLO)
    first = castor(tmp_path, "cast", "hi", "--agent", "script:answers.json", "--quiet", cwd=root)
    assert first.returncode == 1
    (run_dir,) = run_dirs(root)
    cast_id = run_dir.name
    line = last_error(first)
    assert "interrupted" in line and f"castor continue {cast_id}" in line and "/materia" not in line
    assert not (run_dir / "sockets" / "Socket-1" / "1.md").exists()  # the cut-off text is no output
    shown = castor(tmp_path, "status", cast_id[:-3], cwd=root)  # a unique prefix
    assert shown.returncode == 0 and "[interrupted]" in shown.stdout and f"castor continue {cast_id}" in shown.stdout
    listed = castor(tmp_path, "casts", cwd=root)
    assert f"{cast_id}  interrupted" in listed.stdout and f"castor recast {cast_id}" in listed.stdout
    # the listing names the command status names first (it named only recast)
    assert f"continue: castor continue {cast_id} (or abort: castor abort {cast_id})" in listed.stdout
    (root / "answers.json").write_text(json.dumps(["REAL ANSWER"]))
    done = castor(tmp_path, "continue", "latest", "--quiet", cwd=root)
    assert done.returncode == 0, done.stderr
    assert (run_dir / "sockets" / "Socket-1" / "1.md").read_text() == "REAL ANSWER"
    types = [json.loads(line)["type"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert types.count("turn_interrupted") == 1 and "turn_resumed" in types


@pytest.mark.timeout(60)
def test_continue_refuses_a_complete_or_failed_cast_naming_only_commands_that_work(tmp_path) -> None:
    root = project(tmp_path, ["hello"], HELLO)
    assert castor(tmp_path, "cast", "hi", "--agent", "script:answers.json", "--quiet", cwd=root).returncode == 0
    for verb in ("continue", "recast", "revive"):
        refused = castor(tmp_path, verb, "latest", cwd=root)
        line = last_error(refused)
        assert refused.returncode == 1 and line.startswith("castor: conflict: ") and "complete" in line
        assert "castor recast" not in line and "castor revive" not in line and "/materia" not in line


# ----------------------------------------------------------------------------- abort


@pytest.mark.timeout(120)
def test_castor_abort_stops_a_cast_another_cli_process_runs_and_recast_completes_it(tmp_path) -> None:
    root, proc, run_dir = cast_waiting_at_w2(tmp_path, w2_delay_ms=60_000)
    try:
        refused = castor(tmp_path, "loadout", "hello", cwd=root)
        assert refused.returncode == 1 and f"castor abort {run_dir.name}" in last_error(refused)
        aborted = castor(tmp_path, "abort", "latest", cwd=root)
        assert aborted.returncode == 0, aborted.stderr
        assert "aborted" in aborted.stdout and f"castor recast {run_dir.name}" in aborted.stdout
        _out, err = proc.communicate(timeout=30)  # the running process ended the cast and exits
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and "aborted" in err and f"castor recast {run_dir.name}" in err
    s = state(run_dir)
    assert s["aborted"] is True and s["active"] is False
    assert "2-w2.md" not in outputs(run_dir, "Socket-4")
    again = castor(tmp_path, "abort", run_dir.name, cwd=root)  # a second abort is no error
    assert again.returncode == 0 and "already aborted" in again.stdout
    (root / "answers.json").write_text(json.dumps(build_answers()))  # no more 60 s wait for w2
    done = castor(tmp_path, "recast", run_dir.name[:-2], "--quiet", cwd=root, timeout=90)
    assert done.returncode == 0, done.stderr
    assert outputs(run_dir, "Socket-4") == {"1-w1.md": "Built the parser.", "2-w2.md": "Built the CLI."}


@pytest.mark.timeout(120)
def test_castor_status_of_a_cast_another_process_runs_says_so(tmp_path) -> None:
    """``castor status ID`` of a cast another castor runs (a harness's ``castor serve``, another
    ``castor cast``): the view says it runs elsewhere (``elsewhere: true`` in ``--json``), as the
    harness's own ``/materia status`` does, instead of reading like a cast this command could drive."""
    root, proc, run_dir = cast_waiting_at_w2(tmp_path, w2_delay_ms=60_000)
    try:
        shown = castor(tmp_path, "status", run_dir.name, cwd=root)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("This pi-materia cast runs in another castor runtime")
        assert f"castor abort {run_dir.name}" in shown.stdout and "[active]" in shown.stdout
        as_json = json.loads(castor(tmp_path, "status", "latest", "--json", cwd=root).stdout)
        assert as_json["elsewhere"] is True and as_json["status"] == "active"
    finally:
        proc.kill()
        proc.wait(10)
    orphaned = json.loads(castor(tmp_path, "status", "latest", "--json", cwd=root).stdout)
    assert orphaned["status"] == "orphaned" and "elsewhere" not in orphaned  # nobody runs it now


@pytest.mark.timeout(90)
def test_castor_abort_of_an_orphaned_cast_and_of_an_ended_one(tmp_path) -> None:
    root = project(tmp_path, [{"text": "slow", "delay_ms": 60_000}], HELLO)
    proc = spawn(tmp_path, "cast", "hi", "--agent", "script:answers.json", "--quiet", cwd=root)
    try:
        wait_for(lambda: run_dirs(root), 60, "the run directory")
        (run_dir,) = run_dirs(root)
        wait_for(lambda: (state_or_none(run_dir).get("pending") or {}).get("kind") == "agent_turn", 60, "the turn")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    t0 = time.monotonic()
    aborted = castor(tmp_path, "abort", run_dir.name, cwd=root)  # no --agent needed to stop a cast
    assert aborted.returncode == 0, aborted.stderr
    assert time.monotonic() - t0 < 30  # generous: a process start under load; it never waits for the model
    assert state(run_dir)["aborted"] is True
    shown = castor(tmp_path, "casts", cwd=root)
    assert f"castor recast {run_dir.name}" in shown.stdout and "/materia" not in shown.stdout


# ----------------------------------------------------------------------------- ids


@pytest.mark.timeout(90)
def test_ids_are_exact_a_unique_prefix_or_latest_and_an_ambiguous_prefix_lists_the_candidates(tmp_path) -> None:
    root = project(tmp_path, ["one", "two"], HELLO)
    for _ in range(2):
        assert castor(tmp_path, "cast", "hi", "--agent", "script:answers.json", "--quiet", cwd=root).returncode == 0
    older, newer = (p.name for p in run_dirs(root))
    common = os.path.commonprefix([older, newer])
    assert common
    ambiguous = castor(tmp_path, "status", common, cwd=root)
    line = last_error(ambiguous)
    assert ambiguous.returncode == 1 and line.startswith("castor: invalid_params: ")
    assert "ambiguous" in line and older in line and newer in line
    latest = castor(tmp_path, "status", "latest", "--json", cwd=root)
    assert json.loads(latest.stdout)["cast_id"] == newer
    exact = castor(tmp_path, "status", older, "--json", cwd=root)
    assert json.loads(exact.stdout)["cast_id"] == older
    unknown = castor(tmp_path, "status", "1999-", cwd=root)
    assert unknown.returncode == 1 and last_error(unknown).startswith("castor: not_found: ")
    hostile = castor(tmp_path, "abort", "../../etc", cwd=root)
    assert hostile.returncode == 1 and last_error(hostile).startswith("castor: forbidden: ")


def test_docs_show_the_same_complete_example_as_the_help() -> None:
    text = (REPO / "docs" / "materia.md").read_text()
    section = text[text.index("#### The scripted agent"):]
    block = section[section.index("```json\n") + 8:section.index("\n```", section.index("```json\n"))]
    assert json.loads(block) == help_example()


UTILITY = {"activeLoadout": "U", "loadouts": {"U": {"entry": "Socket-1", "sockets": {
    "Socket-1": {"type": "agent", "materia": "greeter", "edges": [{"to": "Socket-2"}]},
    "Socket-2": {"type": "utility", "command": ["sh", "-c", "pwd > where.txt; echo ok"]}}}}}


def _interrupted_utility_cast(tmp_path: Path) -> tuple[Path, str]:
    root = project(tmp_path, ["hi", "hi"], UTILITY)
    (root / "esc.json").write_text(json.dumps([{"text": "x", "stop_reason": "aborted"}]))
    assert castor(tmp_path, "cast", "A", "--agent", "script:esc.json", "--quiet", cwd=root).returncode == 1
    [run] = run_dirs(root)
    return root, run.name


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["copied", "moved"])
def test_a_cast_resumed_in_a_copied_or_moved_project_runs_its_commands_there(tmp_path, how):
    """The state names the project's absolute path: a cast continued in a copy of its project ran
    its utility command in the original (writing outside the project the user is in), and in a
    moved one failed (no such directory) however often it was recast. Resumed elsewhere, a cast
    now runs where it is, says so, and records the move in its events."""
    root, cast_id = _interrupted_utility_cast(tmp_path)
    other = tmp_path / "other"
    if how == "copied":
        import shutil

        shutil.copytree(root, other, symlinks=True)
    else:
        root.rename(other)
    done = castor(tmp_path, "continue", "latest", "--agent", "script:answers.json", cwd=other)
    assert done.returncode == 0, done.stderr
    assert (other / "where.txt").read_text().strip() == str(other)
    assert not (root / "where.txt").exists()
    assert f"moved or copied from {root}: it runs in {other} now" in done.stdout + done.stderr
    run = casts_dir(other) / cast_id
    assert state(run)["cwd"] == str(other) and state(run)["run_dir"] == str(run)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    [moved] = [e["data"] for e in events if e["type"] == "cast_relocated"]
    assert moved["from"] == {"cwd": str(root), "runDir": str(root / ".pi" / "pi-materia" / cast_id)}
    assert moved["to"] == {"cwd": str(other), "runDir": str(run)}


@pytest.mark.timeout(120)
def test_a_state_copied_from_another_casts_directory_is_refused_not_taken_for_that_cast(tmp_path):
    root, first = _interrupted_utility_cast(tmp_path)
    assert castor(tmp_path, "cast", "B", "--agent", "script:esc.json", "--quiet", cwd=root).returncode == 1
    second = next(run.name for run in run_dirs(root) if run.name != first)
    original = (casts_dir(root) / first / "state.json").read_bytes()
    (casts_dir(root) / second / "state.json").write_bytes(original)
    done = castor(tmp_path, "continue", second, "--agent", "script:answers.json", cwd=root)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and last.startswith("castor: state_corrupt:") and f"cast '{first}'" in last, done.stderr
    assert "state_corrupt" in castor(tmp_path, "status", second, cwd=root).stderr
    assert not (root / "where.txt").exists()
    assert (casts_dir(root) / first / "state.json").read_bytes() == original


def _plant(run: Path, what: str, outside: Path) -> None:
    if what == "a link to outside as sockets/":
        import shutil

        shutil.rmtree(run / "sockets")
        (run / "sockets").symlink_to(outside, target_is_directory=True)
    elif what == "a directory as events.jsonl":
        (run / "events.jsonl").unlink()
        (run / "events.jsonl").mkdir()
    elif what == "a FIFO as events.jsonl":
        (run / "events.jsonl").unlink()
        os.mkfifo(run / "events.jsonl")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("what, code", [("a link to outside as sockets/", "forbidden"),
                                        ("a directory as events.jsonl", "forbidden"),
                                        ("a FIFO as events.jsonl", "forbidden")])
def test_something_planted_in_a_run_directory_stops_a_resume_with_one_line(tmp_path, what, code):
    """A link, a directory or a FIFO where a resumed cast writes sent its actor into a crash loop
    (six tracebacks, "giving up", `actor_stopped`) or hung it (a FIFO waits for a reader). Now the
    resume stops at once with the typed error naming what is wrong, and nothing is written through."""
    root, cast_id = _interrupted_utility_cast(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    _plant(casts_dir(root) / cast_id, what, outside)
    done = castor(tmp_path, "continue", "latest", "--agent", "script:answers.json", cwd=root, timeout=60)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith(f"castor: {code}:"), done.stderr
    assert "Traceback" not in done.stderr and "giving up" not in done.stderr
    assert list(outside.iterdir()) == [] and not (root / "where.txt").exists()


@pytest.mark.timeout(120)
def test_a_fifo_planted_as_state_json_is_listed_unreadable_not_waited_on(tmp_path):
    """``castor casts`` and ``castor status`` opened state.json blocking: a FIFO in its place hung
    them (and every listing of the project) until killed."""
    root, cast_id = _interrupted_utility_cast(tmp_path)
    state_file = casts_dir(root) / cast_id / "state.json"
    state_file.unlink()
    os.mkfifo(state_file)
    listed = castor(tmp_path, "casts", cwd=root, timeout=30)
    assert listed.returncode == 0 and "unreadable" in listed.stdout and "not a regular file" in listed.stdout
    status = castor(tmp_path, "status", cast_id, cwd=root, timeout=30)
    assert status.returncode != 0 and "state_corrupt" in status.stderr and "not a regular file" in status.stderr


@pytest.mark.timeout(120)
def test_a_state_with_a_field_castor_cannot_read_is_listed_unreadable_and_named_by_every_verb(tmp_path):
    """A hand-edited state.json (``phase: 12345``) was listed as a recast target, and every verb on
    it said only ``invalid_message: invalid cast state: 1 problem(s)``."""
    root, cast_id = _interrupted_utility_cast(tmp_path)
    path = casts_dir(root) / cast_id / "state.json"
    document = json.loads(path.read_text())
    document["state"]["phase"] = 12345
    path.write_text(json.dumps(document))
    listed = castor(tmp_path, "casts", cwd=root)
    assert "unreadable" in listed.stdout and "phase" in listed.stdout and "RECAST" not in listed.stdout
    for verb in ("status", "recast", "continue"):
        done = castor(tmp_path, verb, cast_id, "--agent", "script:answers.json", cwd=root) if verb != "status" \
            else castor(tmp_path, verb, cast_id, cwd=root)
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode != 0 and last.startswith("castor: state_corrupt:"), (verb, done.stderr)
        assert str(path) in last and "phase" in last, (verb, last)


@pytest.mark.timeout(120)
def test_a_turn_ending_in_a_transient_transport_error_does_not_leave_the_cli_waiting_forever(tmp_path):
    """The cast waits for the turn's retry after a transient transport error, as the spec says: in Pi,
    Pi retries such a turn itself and its next end completes it. No agent of the CLI retries, so
    ``castor cast`` never returned (killed by hand). It now ends, saying how to go on."""
    config = {"activeLoadout": "L", "materia": {"T": {"prompt": "say {{request}}", "tools": "none"}},
              "loadouts": {"L": {"entry": "Socket-1", "sockets": {"Socket-1": {"type": "agent", "materia": "T"}}}}}
    root = project(tmp_path, [{"key": "Socket-1", "error": "WebSocket error"}], config)
    done = castor(tmp_path, "cast", "x", "--agent", "script:answers.json", "--quiet", cwd=root, timeout=60)
    [run] = run_dirs(root)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and "transient transport error" in last and f"castor continue {run.name}" in last
    assert state(run)["active"] is True  # nothing lost: it still waits, and `castor continue` re-sends the turn


@pytest.mark.timeout(30)
def test_a_second_castor_abort_while_the_first_waits_answers_already_aborted(tmp_path, monkeypatch, capsys) -> None:
    """Two ``castor abort``s of a cast another process runs, the second while the first's request
    still waits to be taken: both said "aborted", where a second abort in Pi (however close) answers
    "already aborted". The second finds the first's request, leaves it be and says "already"."""
    import threading

    import castor.actors.materia.views as views
    import castor.cli.materia as cli

    root = tmp_path / "casts"
    (root / "C").mkdir(parents=True)
    taken = threading.Event()
    polled: dict[str, threading.Event] = {"first": threading.Event(), "second": threading.Event()}

    def view(_storage: Any, _root: Path, _cast_id: str, *, live: bool) -> dict[str, Any]:
        polled[threading.current_thread().name].set()  # its request is written (or found) by now
        return {"active": not taken.is_set(), "status": "aborted" if taken.is_set() else "active"}

    monkeypatch.setattr(views, "persisted_view", view)
    threads = [threading.Thread(target=cli._abort_elsewhere, args=(root, "C"), name=name)
               for name in ("first", "second")]
    for thread in threads:
        thread.start()
        assert polled[thread.name].wait(10)
    (root / "C" / "abort.request").unlink()  # the running command takes the request...
    taken.set()  # ...and aborts the cast
    for thread in threads:
        thread.join(10)
    said = capsys.readouterr().out.splitlines()
    assert sorted(said) == ["pi-materia cast C aborted. Recast it with castor recast C.",
                            "pi-materia cast C is already aborted. Recast it with castor recast C."], said
    assert not (root / "C" / "abort.request").exists()


def _abort_at_the_barrier(barrier: Any, home: str, cwd: str, cast_id: str, out: str) -> None:
    """One ``castor abort CAST_ID`` in a process of its own, run once every party reached ``barrier``;
    what it printed and its exit status go to ``out`` (a spawned process has no captured streams)."""
    import contextlib
    import io

    os.environ.update({"HOME": home, "CASTOR_AGENT": "", "MATERIA_CONFIG": "",
                       "PI_MATERIA_PROFILE_DIR": str(Path(home) / "profile")})
    os.chdir(cwd)
    from castor.cli.app import main  # imported before the barrier: both start the command at once

    stdout, stderr = io.StringIO(), io.StringIO()
    barrier.wait(60)
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["abort", cast_id])
    Path(out).write_text(json.dumps({"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}))


@pytest.mark.timeout(240)
def test_two_castor_aborts_of_a_cast_no_process_holds_one_aborts_the_other_says_already(tmp_path) -> None:
    """Two ``castor abort`` processes released together by a barrier on a cast no process holds:
    both saw it active with its lease free, one took the lease and aborted it, and the other -- its
    lease taken meanwhile -- asked "the holder" to abort and, finding it aborted, said "aborted"
    too. They take turns on the run directory's abort lock: exactly one says aborted, the other
    "already aborted". Four rounds, each a fresh cast (unfixed, about one round in ten met the race)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # a fresh interpreter each, as a second terminal is
    config = {"activeLoadout": "One", "loadouts": {"One": {"entry": "Socket-1", "sockets": {
        "Socket-1": {"type": "agent", "materia": "greeter"}}}}}
    root = project(tmp_path, [{"text": "x", "stop_reason": "aborted"}], config)
    for round_ in range(4):
        done = castor(tmp_path, "cast", f"round {round_}", "--agent", "script:answers.json", "--quiet", cwd=root)
        assert done.returncode == 1 and "interrupted" in done.stderr, done.stderr
        run = run_dirs(root)[-1]
        barrier = context.Barrier(2)
        outs = [tmp_path / f"abort-{round_}-{n}.json" for n in (1, 2)]
        env_path = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env_path) if p)
        try:
            procs = [context.Process(target=_abort_at_the_barrier,
                                     args=(barrier, str(tmp_path / "home"), str(root), run.name, str(out)))
                     for out in outs]
            for proc in procs:
                proc.start()
            for proc in procs:
                proc.join(120)
        finally:
            os.environ["PYTHONPATH"] = env_path
        results = [json.loads(out.read_text()) for out in outs]
        said = sorted(r["stdout"].strip() for r in results)
        assert [r["code"] for r in results] == [0, 0], results
        assert said == [f"pi-materia cast {run.name} aborted. Recast it with castor recast {run.name}.",
                        f"pi-materia cast {run.name} is already aborted. Recast it with castor recast {run.name}."], \
            (round_, results)
        assert state(run)["aborted"] is True and state(run)["active"] is False


def test_castor_abort_names_a_directory_planted_as_the_abort_request_and_what_to_do(tmp_path) -> None:
    """A directory with something in it where ``castor abort`` leaves its request for the running
    command (a checkout can ship one): the abort failed ``conflict`` "Is a directory (EISDIR)",
    which says nothing of what to do. It names the directory and the ``rm`` that clears it."""
    import castor.cli.materia as cli
    from castor.ports.cast_storage import StateCorrupt

    root = tmp_path / "casts"
    planted = root / "C" / "abort.request"
    (planted / "inside").mkdir(parents=True)
    with pytest.raises(StateCorrupt) as refused:
        cli._abort_elsewhere(root, "C")
    assert str(planted) in refused.value.message and f"rm -r {planted}" in refused.value.message
    assert refused.value.data["reason"] == "abort_request_is_a_directory"
    assert (planted / "inside").is_dir()  # nothing of it removed


@pytest.mark.parametrize("stale", ["left_from_before", "no_timestamp", "link"])
def test_a_new_abort_request_written_while_a_stale_one_is_judged_is_taken_on_the_next_poll(
        tmp_path, monkeypatch, stale) -> None:
    """The runtime holding the cast read a stale ``abort.request`` (a killed ``castor abort``'s, or
    one a checkout ships), and before it removed it a new ``castor abort`` replaced it with its own
    (the stale one's writer is gone): the holder removed the new request with the stale one, so the
    cast went on and the new abort answered ``conflict`` after its wait. The holder removes only
    the request it read; the new one is taken on the next poll."""
    import castor.adapters.materia.abort_requests as abort_requests
    import castor.cli.materia as cli

    run_dir = tmp_path / "casts" / "C"
    run_dir.mkdir(parents=True)
    request = run_dir / abort_requests.ABORT_REQUEST
    gone_pid = 2**31 - 1  # no such process: its writer is gone
    if stale == "left_from_before":
        request.write_text(json.dumps({"requested_at": 1.0, "pid": gone_pid}))
    elif stale == "no_timestamp":
        request.write_text(json.dumps({"pid": gone_pid}))
    else:
        (tmp_path / "elsewhere.json").write_text(json.dumps({"requested_at": 1.0, "pid": gone_pid}))
        request.symlink_to(tmp_path / "elsewhere.json")
    judged = abort_requests.requested_at
    new_requests: list[bool] = []

    def read_then_a_new_abort_arrives(path: Path) -> float | None:
        asked_at = judged(path)
        if not new_requests:  # the new castor abort, between this read and the removal
            new_requests.append(cli._ask_to_abort(request))
        return asked_at

    monkeypatch.setattr(abort_requests, "requested_at", read_then_a_new_abort_arrives)
    warned: list[str] = []
    requests = abort_requests.AbortRequests(request, time.time() - 1, warned.append)
    assert requests.asked() is False  # the stale one: removed, not applied
    assert new_requests == [True] and len(warned) == 1 and "not applied" in warned[0], warned
    assert requests.asked() is True  # the new one, on the next poll
    assert not os.path.lexists(request)
    assert sorted(os.listdir(run_dir)) == []  # nothing of either left behind
