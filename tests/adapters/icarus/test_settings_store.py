"""Settings files: tolerant reads, locked atomic read-modify-write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from castor.adapters.icarus.settings_store import (
    SettingsFileMalformed,
    SettingsLockTimeout,
    load_settings,
    read_layer,
    update_settings,
)
from castor.domain.icarus.settings import apply_bool_default
from castor.messages.errors import CastorError, ErrorCode


def set_key(key, value):
    def mutate(doc):
        section = dict(doc.get("piIcarusHook", {}))
        section[key] = value
        return {**doc, "piIcarusHook": section}
    return mutate


def test_write_creates_file_and_preserves_unrelated_keys(tmp_path):
    path = tmp_path / "agent" / "settings.json"
    update_settings(str(path), set_key("a", 1))
    path.write_text(json.dumps({"theme": "dark", "piIcarusHook": {"a": 1, "keep": True}}))
    update_settings(str(path), lambda doc: apply_bool_default(doc, "contextDisplay", "hide")[0])
    doc = json.loads(path.read_text())
    assert doc == {"theme": "dark", "piIcarusHook": {"a": 1, "keep": True, "contextDisplay": False}}
    assert path.read_text().endswith("}\n")
    assert not (tmp_path / "agent" / "settings.json.lock").exists()
    assert [p.name for p in (tmp_path / "agent").iterdir()] == ["settings.json"]  # no temp files left


@pytest.mark.parametrize("content", ["{broken", "[1, 2]", '"text"', '{"piIcarusHook": {"timeoutMs": NaN}}',
                                     '{"a": Infinity}', '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                     '{"a": ' + "[" * 950 + "]" * 950 + "}"])  # parses, but deeper than a scrub
def test_malformed_file_is_never_overwritten(tmp_path, content):
    path = tmp_path / "settings.json"
    path.write_text(content)
    before = path.read_bytes()
    with pytest.raises(SettingsFileMalformed) as info:
        update_settings(str(path), set_key("a", 1))
    assert info.value.code == ErrorCode.INVALID_CONFIG and info.value.data["path"] == str(path)
    assert path.read_bytes() == before


def test_rejected_section_is_never_overwritten(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"piIcarusHook": 3}')
    with pytest.raises(SettingsFileMalformed):
        update_settings(str(path), lambda doc: apply_bool_default(doc, "contextDisplay", "hide")[0])
    assert path.read_text() == '{"piIcarusHook": 3}'


def test_mutation_error_writes_nothing(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"x": 1}')

    def explode(doc):
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        update_settings(str(path), explode)
    assert path.read_text() == '{"x": 1}'


def test_concurrent_threads_lose_no_key(tmp_path):
    path = str(tmp_path / "settings.json")
    barrier = threading.Barrier(6)

    def writer(n):
        barrier.wait()
        for j in range(10):
            update_settings(path, set_key(f"t{n}_{j}", j))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    section = json.loads(open(path).read())["piIcarusHook"]
    assert set(section) == {f"t{n}_{j}" for n in range(6) for j in range(10)}


_WRITER = """
import sys
from castor.adapters.icarus.settings_store import update_settings
path, name, go = sys.argv[1], sys.argv[2], sys.argv[3]
import os, time
while not os.path.exists(go):
    time.sleep(0.005)
for j in range(8):
    def mutate(doc, j=j):
        section = dict(doc.get("piIcarusHook", {}))
        section[f"{name}_{j}"] = j
        return {**doc, "piIcarusHook": section}
    update_settings(path, mutate, lock_timeout_s=20)
"""


@pytest.mark.timeout(60)
def test_concurrent_processes_lose_no_key(tmp_path):
    path = str(tmp_path / "settings.json")
    with open(path, "w") as handle:
        json.dump({"unrelated": {"deep": [1, 2]}}, handle)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, path, f"p{n}", str(go)]) for n in range(4)]
    go.touch()
    assert [p.wait(timeout=50) for p in procs] == [0, 0, 0, 0]
    doc = json.loads(open(path).read())
    assert doc["unrelated"] == {"deep": [1, 2]}
    assert set(doc["piIcarusHook"]) == {f"p{n}_{j}" for n in range(4) for j in range(8)}


def test_pi_style_lock_directory_blocks_then_releases(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{}")
    lock_dir = tmp_path / "settings.json.lock"
    lock_dir.mkdir()  # what Pi's proper-lockfile holds
    done = threading.Event()

    def write():
        update_settings(str(path), set_key("a", 1), lock_timeout_s=10)
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    assert not done.wait(0.3)  # still waiting for Pi's lock
    assert path.read_text() == "{}"
    lock_dir.rmdir()
    assert done.wait(5)
    thread.join()
    assert json.loads(path.read_text()) == {"piIcarusHook": {"a": 1}}


def test_busy_lock_times_out_without_writing(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{}")
    (tmp_path / "settings.json.lock").mkdir()
    with pytest.raises(SettingsLockTimeout) as info:
        update_settings(str(path), set_key("a", 1), lock_timeout_s=0.2)
    assert info.value.code == ErrorCode.TIMEOUT and info.value.may_have_started is False
    assert path.read_text() == "{}"


def test_stale_lock_is_taken_over(tmp_path):
    path = tmp_path / "settings.json"
    lock_dir = tmp_path / "settings.json.lock"
    lock_dir.mkdir()
    old = time.time() - 60
    os.utime(lock_dir, (old, old))
    update_settings(str(path), set_key("a", 1), lock_timeout_s=2)
    assert json.loads(path.read_text()) == {"piIcarusHook": {"a": 1}}


def test_tolerant_reads(tmp_path):
    missing = read_layer(str(tmp_path / "none.json"), "global")
    assert missing.doc is None and missing.error is None
    (tmp_path / "bad.json").write_text("{nope")
    assert read_layer(str(tmp_path / "bad.json"), "global").error == "not valid JSON"
    (tmp_path / "list.json").write_text("[]")
    assert read_layer(str(tmp_path / "list.json"), "global").error == "top level is not an object"


def test_load_settings_reads_trusted_project_only(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "proj"
    (home / ".pi" / "agent").mkdir(parents=True)
    (cwd / ".pi").mkdir(parents=True)
    (home / ".pi" / "agent" / "settings.json").write_text(json.dumps({"piIcarusHook": {"footerStatus": "G"}}))
    (cwd / ".pi" / "settings.json").write_text(json.dumps(
        {"piIcarusHook": {"footerStatus": "P", "python": "./evil-python", "icarusDir": "./evil"}}))
    env = {"PATH": os.environ.get("PATH", "")}
    untrusted = load_settings(str(cwd), trusted=False, env=env, home=str(home))
    assert untrusted.footer_status == "G" and untrusted.python == "python3"
    assert untrusted.icarus_dir == str(home / ".hermes" / "plugins" / "icarus")
    trusted = load_settings(str(cwd), trusted=True, env=env, home=str(home))
    assert trusted.footer_status == "P" and trusted.icarus_dir == str(cwd / ".pi" / "evil")
    (cwd / ".pi" / "settings.json").write_text("{corrupt")
    fallback = load_settings(str(cwd), trusted=True, env=env, home=str(home))
    assert fallback.footer_status == "G" and fallback.warnings


@pytest.mark.timeout(20)
def test_devices_fifos_and_huge_files_are_unreadable_at_once(tmp_path):
    """A settings path to /dev/zero or a FIFO would hang a session open (or fill memory)."""
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.json"
    huge.write_text('{"x": "' + "a" * (5 * 1024 * 1024) + '"}')
    for path in (zero, fifo, huge):
        layer = read_layer(str(path), "global")
        assert layer.doc is None and layer.error.startswith("unreadable"), path
        with pytest.raises(SettingsFileMalformed):
            update_settings(str(path), set_key("a", 1))


def test_lone_surrogates_in_a_settings_file_are_replaced(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"piIcarusHook": {"footerStatus": "x\\ud800y"}}')
    assert read_layer(str(path), "global").doc == {"piIcarusHook": {"footerStatus": "x\ufffdy"}}


def test_a_symlinked_settings_file_is_written_through_and_stays_a_link(tmp_path):
    real = tmp_path / "dotfiles" / "settings.json"
    real.parent.mkdir()
    real.write_text(json.dumps({"theme": "dark"}))
    link = tmp_path / "agent" / "settings.json"
    link.parent.mkdir()
    link.symlink_to(real)
    update_settings(str(link), set_key("contextDisplay", "hide"))
    assert link.is_symlink()
    assert json.loads(real.read_text()) == {"theme": "dark", "piIcarusHook": {"contextDisplay": "hide"}}


def test_a_timeout_over_a_day_is_invalid_and_the_default_applies(tmp_path):
    from castor.domain.icarus.settings import MAX_POSITIVE_INT, parse_positive_int

    assert parse_positive_int(MAX_POSITIVE_INT) == MAX_POSITIVE_INT
    assert parse_positive_int(99_999_999_999_999) is None and parse_positive_int("9" * 40) is None
    home, cwd = tmp_path / "home", tmp_path / "proj"
    (home / ".pi" / "agent").mkdir(parents=True)
    cwd.mkdir()
    (home / ".pi" / "agent" / "settings.json").write_text(
        json.dumps({"piIcarusHook": {"timeoutMs": 99_999_999_999_999}})
    )
    settings = load_settings(str(cwd), trusted=True, env={"PATH": os.environ.get("PATH", "")}, home=str(home))
    assert settings.timeout_ms == 30000


def test_a_projects_settings_file_linked_outside_the_project_is_never_written_through(tmp_path):
    """`/icarus context default show project` rewrote the file a project's .pi/settings.json links
    to, wherever it was. Confined to the project, such a link is refused and nothing is written;
    the user's global settings may still be a link into their dotfiles (written through)."""
    from castor.messages.errors import Forbidden

    outside = tmp_path / "outside" / "x.json"
    outside.parent.mkdir()
    outside.write_text('{"keep": true}\n')
    project = tmp_path / "project"
    (project / ".pi").mkdir(parents=True)
    (project / ".pi" / "settings.json").symlink_to(outside)
    with pytest.raises(Forbidden) as refused:
        update_settings(str(project / ".pi" / "settings.json"), set_key("a", 1), confine_to=str(project))
    assert refused.value.data["reason"] == "symlink"
    assert outside.read_text() == '{"keep": true}\n'
    inside = project / ".pi" / "real.json"
    inside.write_text("{}\n")
    (project / ".pi" / "settings.json").unlink()
    (project / ".pi" / "settings.json").symlink_to(inside)  # a link within the project is fine
    update_settings(str(project / ".pi" / "settings.json"), set_key("a", 1), confine_to=str(project))
    assert json.loads(inside.read_text()) == {"piIcarusHook": {"a": 1}}
    update_settings(str(project / ".pi" / "settings.json"), set_key("b", 2))  # unconfined: as before


def _in_a_child_without_write_permission(fn):
    """``fn()`` in a forked child that cannot write where root could (as root: the child becomes
    ``nobody``, so the directory's mode applies to it); its outcome, ``("ok", …)`` or ``(type, errno)``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            try:
                outcome = ["ok", repr(fn())]
            except BaseException as exc:  # noqa: BLE001 - the child reports whatever it met
                outcome = [type(exc).__name__, getattr(exc, "errno", None)]
            os.write(write_end, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return tuple(json.loads(data))


@pytest.mark.timeout(30)
def test_a_directory_that_refuses_the_lock_file_is_the_storages_refusal_not_a_busy_lock():
    """A settings directory castor's user may no longer write (a permission taken away) refused the
    lock file with EACCES, which was read as "another writer holds the lock": the write waited out
    the lock timeout and answered ``timeout: settings lock … busy``. No writer will ever release it:
    the PermissionError goes up at once (the endpoint answers ``storage_unavailable``, errno EACCES)."""
    import shutil
    import tempfile

    # Not under tmp_path: pytest keeps its base directory 0700, and as root the child runs as nobody.
    base = Path(tempfile.mkdtemp(prefix="castor-perm-"))
    try:
        base.chmod(0o755)
        directory = base / ".pi"
        directory.mkdir()
        path = directory / "settings.json"
        path.write_text("{}")
        # A write that works first: whatever it imports lazily is loaded before the child, which
        # may no longer read the interpreter's own files, runs it.
        update_settings(str(base / "warm.json"), set_key("a", 1))
        directory.chmod(0o555)
        started = time.monotonic()
        outcome = _in_a_child_without_write_permission(
            lambda: update_settings(str(path), set_key("a", 1), lock_timeout_s=3.0))
        elapsed = time.monotonic() - started
        assert outcome == ("PermissionError", 13), outcome
        assert elapsed < 2.0, elapsed
        assert path.read_text() == "{}"
    finally:
        (base / ".pi").chmod(0o755)
        shutil.rmtree(base)


@pytest.mark.parametrize("name", ["EIO", "EMFILE", "ENFILE", "EACCES"])
def test_a_settings_file_the_storage_will_not_read_for_a_write_is_storage_unavailable_not_malformed(
        tmp_path, monkeypatch, name):
    """A settings write reads the file first. When the storage refused that read (a failing disk,
    no file descriptor left, a permission taken away) the write answered ``invalid_config``, "the
    file is malformed": the user was told to fix a file that is fine. It is the storage's refusal,
    ``storage_unavailable`` naming the errno, as the write's own would be; the file is untouched,
    and the next write once the storage reads again goes through."""
    import errno as errnos

    from castor.adapters.icarus import settings_store
    from castor.adapters.icarus.backend import FileIcarusBackend

    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"piIcarusHook": {"contextDisplay": True}, "other": 1}))
    real = settings_store.read_regular_file
    refusing = {"on": True}

    def read_refused(target, *args, **kwargs):
        if refusing["on"] and os.fspath(target) == str(path):
            code = getattr(errnos, name)
            raise OSError(code, os.strerror(code), os.fspath(target))
        return real(target, *args, **kwargs)

    monkeypatch.setattr(settings_store, "read_regular_file", read_refused)
    backend = FileIcarusBackend(env={}, home=str(tmp_path))
    with pytest.raises(CastorError) as refused:
        backend.update_settings(str(path), set_key("contextDisplay", False))
    assert refused.value.code == ErrorCode.STORAGE_UNAVAILABLE, refused.value.to_wire()
    assert refused.value.data["errno"] == name, refused.value.to_wire()
    assert json.loads(path.read_text()) == {"piIcarusHook": {"contextDisplay": True}, "other": 1}
    refusing["on"] = False
    backend.update_settings(str(path), set_key("contextDisplay", False))
    assert json.loads(path.read_text())["piIcarusHook"] == {"contextDisplay": False}
