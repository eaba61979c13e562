"""``castor inspect`` for operators, against a real ``castor serve`` over its socket.

Long actor paths (128-character session ids, the longest allowed), output through a real
shell pipe: ``--json`` must always parse, text must never be wrapped or cut; ``--sort``,
``--prefix``, ``--filter`` and the ``casts`` view are checked on live data (casts waiting on
agent turns that a harness never answers).
"""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from castor.client import Client
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)

CASTOR = [sys.executable, "-m", "castor"]
LONG = ["s" + "a" * 127, "t-" + "b" * 126]  # two sessions with 128-character ids


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    env["PI_CODING_AGENT_DIR"] = str(tmp_path / "home" / ".pi" / "agent")
    env.pop("MATERIA_CONFIG", None)
    env["COLUMNS"] = "80"  # what a narrow terminal would say; a pipe must ignore it
    return env


@pytest.fixture
def live(tmp_path):
    """A serving runtime with two long-named sessions, one cast each waiting on its agent turn."""
    sock = tmp_path / "castor.sock"
    server = subprocess.Popen([*CASTOR, "serve", "--socket", str(sock)], env=_env(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = None
    try:
        wait_for(sock.exists, timeout=20, what="the socket")
        client = Client.connect_unix(str(sock))
        turns: list[dict] = []
        client.on_notification("agent.run_turn", turns.append)
        client.on_request("session.append_entry", lambda p: {"ok": True, "entry_id": "e"})
        casts = {}
        for sid in LONG:
            project = tmp_path / f"proj-{sid[:4]}"
            project.mkdir()
            client.call("session.open", {"session_id": sid, "cwd": str(project), "trusted": True}, timeout=20)
            client.call("loadout.set", {"session_id": sid, "cwd": str(project), "name": "hello"}, timeout=20)
            started = client.call("cast.start", {"session_id": sid, "cwd": str(project), "request": "hi"},
                                  timeout=20)
            casts[sid] = (started.get("cast_id") or started["cast"]["cast_id"], project)
        wait_for(lambda: len(turns) >= 2, timeout=20, what="both agent turns")
        yield sock, casts
    finally:
        if client is not None:
            client.close()
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def _piped(tmp_path: Path, sock: Path, *args: str) -> str:
    """Run ``castor inspect`` with its stdout into a real shell pipe (``| cat``)."""
    argv = " ".join(shlex.quote(a) for a in [*CASTOR, "inspect", "--socket", str(sock), *args])
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {argv} | cat"], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_json_through_a_pipe_is_valid_with_the_longest_paths(tmp_path, live):
    sock, casts = live
    out = _piped(tmp_path, sock, "actors", "--json")
    data = json.loads(out)  # the whole output is one JSON document
    paths = {a["path"] for a in data["actors"]}
    for sid, (cast_id, _project) in casts.items():
        assert f"/root/session/{sid}/cast/{cast_id}" in paths
        assert any(p.startswith(f"/root/session/{sid}/socket/{cast_id}.") for p in paths)
    assert max(len(p) for p in paths) > 160
    waiting = [a for a in data["actors"] if (a.get("activity") or {}).get("kind") == "awaiting_turn"]
    assert len(waiting) == 2


def test_text_through_a_pipe_is_never_wrapped_or_cut(tmp_path, live):
    sock, casts = live
    out = _piped(tmp_path, sock, "actors", "--sort", "age")
    for sid, (cast_id, _project) in casts.items():
        assert f"/root/session/{sid}/cast/{cast_id}" in out  # whole, on one line
    assert "…" not in out
    lines = [ln for ln in out.splitlines() if "awaiting the agent's turn" in ln]
    assert len(lines) >= 2  # each socket actor (and cast) says it on one line


def test_sort_puts_the_longest_waits_first_and_prefix_and_filter_select(tmp_path, live):
    sock, casts = live
    by_age = json.loads(_piped(tmp_path, sock, "actors", "--sort", "age", "--json"))["actors"]
    ages = [a["activity"]["age_s"] if a["activity"]["kind"] != "idle" else 0.0 for a in by_age]
    assert ages == sorted(ages, reverse=True) and ages[0] > 0
    assert by_age[0]["activity"]["kind"] in ("awaiting_turn", "cast")
    by_depth = json.loads(_piped(tmp_path, sock, "actors", "--sort", "depth", "--json"))["actors"]
    depths = [a["mailbox"]["depth"] for a in by_depth]
    assert depths == sorted(depths, reverse=True)
    sid = LONG[1]
    under = json.loads(_piped(tmp_path, sock, "actors", "--prefix", f"/root/session/{sid}", "--json"))["actors"]
    assert under and all(a["path"].startswith(f"/root/session/{sid}") for a in under)
    assert not any(LONG[0] in a["path"] for a in under)
    matched = json.loads(_piped(tmp_path, sock, "actors", "--filter", "SOCKETACTOR", "--json"))["actors"]
    assert len(matched) == 2 and all(a["kind"] == "SocketActor" for a in matched)
    nothing = json.loads(_piped(tmp_path, sock, "actors", "--filter", "no-such-actor-anywhere", "--json"))
    assert nothing["actors"] == [] and nothing["threads"] == []  # the threads are filtered too
    everything = json.loads(_piped(tmp_path, sock, "actors", "--json"))["threads"]
    assert any(t["owner"].startswith("/endpoint") for t in everything)
    endpoint = json.loads(_piped(tmp_path, sock, "actors", "--filter", "/endpoint", "--json"))["threads"]
    assert endpoint and len(endpoint) < len(everything)
    assert all("/endpoint" in f"{t['name']} {t['owner']} {t['purpose']}".lower() for t in endpoint)
    prefixed = _piped(tmp_path, sock, "actors", "--prefix", f"/root/session/{sid}", "--json")
    under_threads = json.loads(prefixed)["threads"]
    assert [t["name"] for t in under_threads] == [t["name"] for t in everything
                                                  if t["owner"].startswith(f"/root/session/{sid}")]


def test_the_casts_view_lists_each_sessions_casts_with_what_they_wait_on(tmp_path, live):
    sock, casts = live
    data = json.loads(_piped(tmp_path, sock, "casts", "--json"))
    sessions = {s["session_id"]: s for s in data["sessions"]}
    assert set(sessions) == set(LONG)
    for sid, (cast_id, project) in casts.items():
        s = sessions[sid]
        assert s["project"] == str(project) and s["label"] == project.name
        (cast,) = s["casts"]
        assert cast["cast_id"] == cast_id and cast["pending"] == "agent_turn" and cast["visit"] == 1
        assert cast["socket"] and cast["waiting_s"] >= 0 and cast["socket_actors"]
    text = _piped(tmp_path, sock, "casts")
    for sid, (cast_id, project) in casts.items():
        assert sid in text and cast_id in text and str(project) in text


def test_follow_json_is_one_valid_document_per_line(tmp_path, live):
    sock, _casts = live
    argv = [*CASTOR, "inspect", "--socket", str(sock), "casts", "--json", "--follow", "--interval", "0.1"]
    # faulthandler on: if Ctrl-C ever leaves the viewer running, SIGABRT makes it print every
    # thread's stack, and the failure carries it (a hang seen once in a loaded full-suite run).
    env = {**_env(tmp_path), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        docs = [json.loads(proc.stdout.readline()) for _ in range(3)]
        assert all(len(d["sessions"]) == 2 for d in docs)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _out, err = proc.communicate(timeout=20)
            pytest.fail(f"castor inspect --follow still running 20 s after Ctrl-C; its threads:\n{err[-8000:]}")
    assert code == 0, proc.stderr.read()


def test_json_to_a_reader_that_goes_away_ends_quietly(tmp_path, live):
    sock, _casts = live
    argv = " ".join(shlex.quote(a) for a in [*CASTOR, "inspect", "--socket", str(sock), "actors", "--json"])
    done = subprocess.run(["bash", "-c", f"{argv} | head -c 10"], env=_env(tmp_path), capture_output=True,
                          text=True, timeout=30)
    assert done.stdout == '{\n  "actor' and "Traceback" not in done.stderr


def test_a_bad_sort_is_a_usage_error(tmp_path):
    done = subprocess.run([*CASTOR, "inspect", "--socket", str(tmp_path / "x.sock"), "--sort", "worst"],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.startswith("castor: invalid_params: ")


def test_a_missing_mailbox_path_and_a_non_loopback_host_are_usage_errors(tmp_path):
    """``inspect mailbox`` without its PATH exited 1 (a failure while running), and ``--tcp`` to a
    host that is not loopback connected there whenever no token was given -- castor never listens
    off this machine -- and blamed the castor it found: ``cancelled: the castor at tcp:10.0.0.1:80
    closed the connection``. Both are refused before anything connects now (exit 2)."""
    missing = subprocess.run([*CASTOR, "inspect", "--socket", str(tmp_path / "x.sock"), "mailbox"],
                             env=_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and missing.stderr.startswith("castor: invalid_params: "), missing.stderr
    assert "PATH" in missing.stderr and missing.stderr.count("\n") == 1
    remote = subprocess.run([*CASTOR, "inspect", "--tcp", "10.255.255.1:80"], env=_env(tmp_path),
                            capture_output=True, text=True, timeout=30)
    assert remote.returncode == 2 and remote.stderr.startswith("castor: forbidden: "), remote.stderr
    assert "10.255.255.1" in remote.stderr and remote.stderr.count("\n") == 1


@pytest.mark.timeout(30)
def test_ctrl_c_in_follow_mode_marks_a_stop_and_never_raises_inside_a_call():
    """The first Ctrl-C only marks the stop (no KeyboardInterrupt inside the client's call in
    progress), a waiting refresh ends at once, a second Ctrl-C raises, and the old handler is back."""
    import threading

    from castor.cli.inspect import _stop_on_ctrl_c

    before = signal.getsignal(signal.SIGINT)
    with _stop_on_ctrl_c() as stop:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
        started = time.monotonic()
        assert stop.wait(10) is True  # woken by the Ctrl-C, not by the 10 s
        assert time.monotonic() - started < 5 and stop.pressed
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises here, at once
    assert signal.getsignal(signal.SIGINT) is before
    with _stop_on_ctrl_c() as fresh:
        assert fresh.wait(0.01) is False and not fresh.pressed


def test_follow_json_ends_at_a_second_ctrl_c_too(tmp_path, live):
    sock, _casts = live
    argv = [*CASTOR, "inspect", "--socket", str(sock), "casts", "--json", "--follow", "--interval", "0.1"]
    proc = subprocess.Popen(argv, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(proc.stdout.readline())["sessions"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(20)
    assert code == 0 and "Traceback" not in proc.stderr.read()


def test_text_follow_to_a_pipe_prints_each_refresh_and_head_ends_it(tmp_path, live):
    """On a pipe, rich's live view printed nothing until it stopped: `--follow | head` showed
    nothing and never ended. Each refresh is printed whole now."""
    sock, casts = live
    argv = " ".join(shlex.quote(a) for a in [*CASTOR, "inspect", "--socket", str(sock), "casts", "--follow",
                                             "--interval", "0.1"])
    done = subprocess.run(["bash", "-c", f"{argv} | head -n 40"], env=_env(tmp_path), capture_output=True,
                          text=True, timeout=30)
    assert any(cast_id in done.stdout for cast_id, _project in casts.values()), done.stdout
    assert "Traceback" not in done.stderr


def test_names_a_model_or_a_project_chose_are_shown_escaped_in_the_views():
    """A work item titled with terminal escapes and a line break drove the operator's terminal and
    forged a line in `castor inspect casts` and `actors`: shown escaped now."""
    from castor.console.terminal import casts_table

    hostile = "Parser\x1b[2J\x1b]0;pwned\x07\nroot  CastActor  running  FORGED"
    sessions = [{"session_id": "s\x1b[31m", "label": "l\nx", "project": "/p\x1b", "casts": [
        {"cast_id": "c1", "phase": "Socket-2", "socket": "Socket-2", "item": hostile, "visit": 1,
         "activity": hostile, "waiting_s": 1.0, "pending": "agent_turn", "socket_actors": []}]}]
    console = Console(file=io.StringIO(), width=400, color_system=None)
    console.print(casts_table(sessions))
    text = console.file.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "FORGED" in text
    assert not any(line.startswith("root  CastActor") for line in text.splitlines())


@pytest.mark.timeout(60)
def test_inspect_where_no_castor_serves_says_so_and_how_to_start_one(tmp_path):
    """A stale socket file, a missing one and a closed port read "storage_unavailable: Connection
    refused" (as if a disk had failed) naming no address; now one line names the address, why,
    and the command that would serve there."""
    import socket as sockets

    stale = tmp_path / "stale.sock"
    listener = sockets.socket(sockets.AF_UNIX)
    listener.bind(str(stale))
    listener.close()  # the file stays; nothing listens
    with sockets.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    cases = [(["--socket", str(stale)], f"unix:{stale} (connection refused; its socket file is still there"),
             (["--socket", str(tmp_path / "missing.sock")], "(no such socket file)"),
             (["--tcp", f"127.0.0.1:{closed_port}"], f"tcp:127.0.0.1:{closed_port} (connection refused)")]
    for where, said in cases:
        done = subprocess.run([sys.executable, "-m", "castor", "inspect", *where], cwd=tmp_path, env=_env(tmp_path),
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 1, done
        assert done.stderr.startswith("castor: not_found: no castor is listening on "), done.stderr
        assert said in done.stderr and "running?" in done.stderr and "Traceback" not in done.stderr


def test_a_bounded_activity_shows_the_deadline_it_will_hit_and_an_unbounded_one_none():
    """A hung hook read "worker call hooks.pre_llm_call for 40.0s": stuck, but until when? The
    tree line and the flat list say how far off the deadline that ends it is (or that it passed);
    an agent turn, which nothing bounds, says nothing of one."""
    from castor.console.terminal import _actor_line, actor_list

    def actor(activity: dict) -> dict:
        return {"path": "/root/session/s/icarus/worker", "kind": "IcarusWorkerActor", "state": "running",
                "incarnation": 1, "restarts": 0, "activity": activity, "last_failure": None,
                "mailbox": {"depth": 0, "oldest_age_s": None, "processed": 0, "failed": 0, "in_flight": None}}

    def text(renderable) -> str:
        out = Console(file=io.StringIO(), record=True, width=400)
        out.print(renderable)
        return out.export_text()

    call = {"kind": "worker_call", "text": "worker call hooks.pre_llm_call", "age_s": 40.0, "data": {},
            "deadline_in_s": 5.25}
    assert "worker call hooks.pre_llm_call for 40.0s, deadline in 5.2s" in text(_actor_line(actor(call)))
    assert "deadline passed 2.0s ago" in text(_actor_line(actor({**call, "deadline_in_s": -2.0})))
    turn = {"kind": "awaiting_turn", "text": "awaiting the agent's turn", "age_s": 7.0, "data": {},
            "deadline_in_s": None}
    assert "deadline" not in text(_actor_line(actor(turn)))
    table = text(actor_list([actor(call), actor(turn)], "age"))
    assert "deadline" in table.splitlines()[2]  # the header row (after the title and the top rule)
    assert "5.2s" in table


def test_a_retired_actor_says_why_in_every_view_and_the_mailbox_view_gives_the_deadline():
    """A worker retired after a timed-out call read "retired: call tools.fabric_write timed out"
    in the tree, but "-" in the flat list's doing column (``--sort``) and nothing at all in
    ``inspect mailbox``; that view also left out the deadline of a bounded activity the tree
    and the list give ("worker call ... for 5.6s" without "deadline in 14.4s")."""
    from castor.console.terminal import actor_list, mailbox_table

    def text(renderable) -> str:
        out = Console(file=io.StringIO(), record=True, width=400)
        out.print(renderable)
        return out.export_text()

    box = {"depth": 0, "capacity": None, "oldest_age_s": None, "processed": 1, "failed": 1, "rejected": 1,
           "dead_letters": 0, "in_flight": None, "by_type": {}}
    retired = {"path": "/root/session/s/icarus/worker", "kind": "IcarusWorkerActor", "state": "retired",
               "incarnation": 1, "restarts": 0, "activity": None, "last_failure": None,
               "retired_reason": "call tools.fabric_write timed out", "mailbox": box}
    assert "retired: call tools.fabric_write timed out" in text(actor_list([retired], "age"))
    assert "call tools.fabric_write timed out" in text(mailbox_table(retired))
    call = {"kind": "worker_call", "text": "worker call tools.fabric_write", "age_s": 5.6, "data": {},
            "deadline_in_s": 14.4}
    busy = {**retired, "state": "running", "retired_reason": None, "activity": call}
    shown = text(mailbox_table(busy))
    assert "worker call tools.fabric_write for 5.6s, deadline in 14.4s" in shown, shown
    assert "retired" not in shown


def test_inspect_of_another_users_castor_says_whose_it_is_in_one_line():
    """``castor inspect`` run by another user read ``forbidden: Permission denied (EACCES)``
    (no address) when the socket file kept it out, and, when the file let it in and the server
    refused the peer, two WARNING lines and ``cancelled: ops.actors: connection closed (write
    failed: [Errno 32] Broken pipe)``. Both are now one typed line naming the address and why."""
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("runs castor inspect as another user (nobody): needs root")
    nobody = 65534

    def drop() -> None:
        os.setgid(nobody)
        os.setuid(nobody)

    try:
        subprocess.run([sys.executable, "-c", "import castor"], preexec_fn=drop, capture_output=True, timeout=30,
                       check=True, cwd="/", env=_env(Path("/tmp")))
    except (PermissionError, subprocess.CalledProcessError) as exc:  # e.g. the interpreter under a 0700 /root
        pytest.skip(f"the other user cannot run this Python and castor here: {exc}")
    base = Path(tempfile.mkdtemp(prefix="castor-other-user-", dir="/tmp"))
    os.chmod(base, 0o755)  # the other user may reach the socket file; its mode decides
    sock = base / "castor.sock"
    env = _env(base)
    server = subprocess.Popen([*CASTOR, "serve", "--socket", str(sock)], env=env, cwd=base,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, timeout=20, what="the socket")

        def as_nobody() -> subprocess.CompletedProcess:
            return subprocess.run([*CASTOR, "inspect", "--socket", str(sock)], cwd=base,
                                  env={**env, "HOME": str(base)}, capture_output=True, text=True, timeout=30,
                                  preexec_fn=drop)

        for mode in (0o600, 0o666):  # the file keeps it out / the server refuses the peer
            os.chmod(sock, mode)
            done = as_nobody()
            assert done.returncode == 1, done
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1, done.stderr
            assert lines[0].startswith(f"castor: forbidden: the castor at unix:{sock} is another user's"), lines
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_inspect_of_a_castor_that_does_not_answer_names_it_in_one_timeout_line(tmp_path):
    """A listener that accepts and never answers read ``timeout: ops.actors got no reply in
    time``: which server, after how long? Now the line names the address and the bound."""
    import socket as sockets
    import threading

    path = tmp_path / "mute.sock"
    listener = sockets.socket(sockets.AF_UNIX)
    listener.bind(str(path))
    listener.listen(4)
    held: list = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # kept open, never answered
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        done = subprocess.run([*CASTOR, "inspect", "--socket", str(path)], cwd=tmp_path, env=_env(tmp_path),
                              capture_output=True, text=True, timeout=60)
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert lines == [f"castor: timeout: the castor at unix:{path} did not answer ops.actors within 10 s"], lines


def test_follow_of_a_castor_that_stops_ends_on_one_line_naming_it(tmp_path):
    """``inspect --follow`` of a castor that is stopped read ``cancelled: ops.actors: connection
    closed``: now the line says which castor went away."""
    sock = tmp_path / "castor.sock"
    server = subprocess.Popen([*CASTOR, "serve", "--socket", str(sock)], env=_env(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watcher = None
    try:
        wait_for(sock.exists, timeout=20, what="the socket")
        watcher = subprocess.Popen([*CASTOR, "inspect", "--socket", str(sock), "--follow", "--json",
                                    "--interval", "0.2"], env=_env(tmp_path), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        assert json.loads(watcher.stdout.readline())["actors"]  # it follows
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        _out, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 1
        assert err.strip().splitlines() == [f"castor: cancelled: the castor at unix:{sock} closed the connection "
                                            "(it stopped, or was restarted)"], err
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
            watcher.wait(10)


def test_the_hosts_view_of_the_local_backend_says_where_casts_run():
    """``castor inspect hosts`` against a local castor printed an empty table titled "cast hosts
    (local)": no word of where the casts run. It says so now."""
    from castor.console.terminal import hosts_table

    out = Console(file=io.StringIO(), record=True, width=200)
    out.print(hosts_table({"backend": "local", "hosts": []}))
    assert "in the castor serve process itself (the local backend)" in out.export_text()


@pytest.mark.timeout(30)
def test_inspect_help_says_what_each_view_shows(tmp_path):
    """``castor inspect --help`` listed ``{actors,casts,mailbox,worker,hosts}`` with no word of
    what any of them shows (nor that ``mailbox`` needs a PATH, or ``--interval``'s default)."""
    done = subprocess.run([*CASTOR, "inspect", "--help"], env={**_env(tmp_path), "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    for said in ("actors (the tree, the default)", "casts (each session's casts", "mailbox PATH (one actor's",
                 "worker (the runtime's process; with --session-id", "hosts (where casts run)", "default 1)"):
        assert said in text, (said, text)


@pytest.mark.parametrize("view, method, answer", [
    ("actors", "ops.actors", {"actors": "not a list"}),
    ("casts", "ops.actors", {"actors": [{"path": 5, "kind": None}]}),
    ("actors", "ops.actors", [1, 2, 3]),
    ("hosts", "ops.hosts", {"hosts": 7}),
])
def test_an_endpoint_answering_in_another_shape_is_one_typed_line_not_a_traceback(tmp_path, view, method, answer):
    """An endpoint that is not a castor (or another version's) answered ``ops.actors`` with a
    result of another shape, and ``castor inspect`` ended in a traceback out of its views
    (AttributeError, TypeError). It says which endpoint and method, as ``invalid_message``. (``--json``
    prints the views that shape nothing, hosts and worker, as they came: valid JSON either way.)"""
    from castor.endpoint import Dispatcher, Server

    dispatcher = Dispatcher(name="not-castor")
    dispatcher.register(method, lambda _params, _ctx: answer)
    sock = tmp_path / "other.sock"
    server = Server(dispatcher, unix_path=str(sock)).start()
    try:
        for json_flag in ([], ["--json"]) if view in ("actors", "casts") else ([],):
            done = subprocess.run([*CASTOR, "inspect", "--socket", str(sock), *json_flag, view],
                                  cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=30)
            assert done.returncode == 1, done
            assert "Traceback" not in done.stderr, done.stderr
            assert done.stderr.startswith(f"castor: invalid_message: the endpoint at unix:{sock} answered {method} "
                                          "with a result castor inspect cannot read"), done.stderr
    finally:
        server.stop()


def test_an_endpoint_sending_undecodable_bytes_is_named_as_such_not_as_a_stopped_castor(tmp_path):
    """A listener that answers with bytes that are no msgpack-rpc read "closed the connection (it
    stopped, or was restarted)"; the reason it was closed (``invalid_frame``) is in the line now."""
    import socket as sockets
    import threading

    sock = tmp_path / "noise.sock"
    listener = sockets.socket(sockets.AF_UNIX)
    listener.bind(str(sock))
    listener.listen(4)

    def noise() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the listener closed: the test is over
            with conn:
                try:  # inspect's first connection is a probe of the listener's user: closed at once
                    if conn.recv(65536):
                        conn.sendall(b"\xc1" * 16)  # 0xc1: never used in msgpack
                        conn.recv(65536)
                except OSError:
                    pass

    threading.Thread(target=noise, daemon=True).start()
    try:
        done = subprocess.run([*CASTOR, "inspect", "--socket", str(sock)], cwd=tmp_path, env=_env(tmp_path),
                              capture_output=True, text=True, timeout=30)
    finally:
        listener.close()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done
    assert "closed the connection (it sent what castor cannot decode (invalid_frame" in done.stderr, done.stderr


def test_a_message_held_or_queued_since_yesterday_reads_in_days_not_tens_of_thousands_of_seconds():
    """The tree line said ``oldest=93784.000s`` and ``busy=materia.session.start 93784.00s`` for a
    handler stuck since yesterday: an operator had to divide to tell a day from a minute. Past a
    minute both read in minutes, hours and days (``1d2h``), as the activity beside them does;
    under a minute as before."""
    from castor.console.terminal import _actor_line

    def line(age: float) -> str:
        actor = {"path": "/root/session/s", "kind": "SessionActor", "state": "running", "incarnation": 1,
                 "restarts": 0, "activity": None, "last_failure": None,
                 "mailbox": {"depth": 1, "oldest_age_s": age, "processed": 3, "failed": 0,
                             "in_flight": {"message_type": "materia.session.start", "since_s": age}}}
        out = Console(file=io.StringIO(), record=True, width=400)
        out.print(_actor_line(actor))
        return out.export_text()

    day = 86400 + 2 * 3600 + 184.0
    assert "oldest=1d2h" in line(day) and "busy=materia.session.start 1d2h" in line(day), line(day)
    assert "oldest=5.250s" in line(5.25) and "busy=materia.session.start 5.25s" in line(5.25), line(5.25)
