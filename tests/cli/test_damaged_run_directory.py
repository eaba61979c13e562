"""A cast's run directory with something else where castor's own file or directory must be --
a FIFO, a plain file, a link -- met by ``castor continue`` / ``castor casts`` from a fresh process.

Each row used to go wrong: a FIFO in place of ``owner.lock`` held ``castor continue`` and
``castor casts`` for ever (the lease probe opened it for reading and waited for a writer); one in
place of ``manifest.json`` held the cast's actor thread until the verb timed out; a link in place
of ``owner.lock`` was followed out of the project (a dangling one made castor create its target);
a link in place of ``state.lock``, or a file or FIFO in place of ``sockets/`` or ``contexts/``,
crash-looped the CastActor until its supervisor gave up (``actor_stopped`` and tracebacks); a FIFO
as a command record (``.commands/<visit>.json``) or as ``abort.request`` held the start for ever. Now
each is a typed one-line error (or, for a lock file that is still a usable file, the cast goes on),
nothing outside the project is touched, and the listing answers."""

from __future__ import annotations

import json
import os

import pytest

from tests.cli.interrupted_cast import ONE_SOCKET, castor_cli, interrupted_cast


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("name", "how", "code"), [
    ("owner.lock", "fifo", None),
    ("owner.lock", "dangling_link", "state_corrupt"),
    ("manifest.json", "fifo", "state_corrupt"),
    ("state.lock", "link", "state_corrupt"),
    ("sockets", "file", "state_corrupt"),
    ("contexts", "fifo", "state_corrupt"),
    (".commands/v.json", "fifo", None),
    ("abort.request", "fifo", None),
])
def test_something_else_in_place_of_a_run_directory_entry_is_typed_never_a_hang_or_crash_loop(
        tmp_path, name, how, code):
    root, run = interrupted_cast(tmp_path)
    target, outside = run / name, tmp_path / "outside-target"
    target.parent.mkdir(exist_ok=True)
    if target.is_dir():
        for child in target.iterdir():
            child.unlink()
        target.rmdir()
    elif target.exists():
        target.unlink()
    if how == "fifo":
        os.mkfifo(target)
    elif how == "file":
        target.write_text("x")
    elif how == "link":
        (tmp_path / "elsewhere").write_text("")
        target.symlink_to(tmp_path / "elsewhere")
    else:
        target.symlink_to(outside)

    done = castor_cli(tmp_path, "continue", run.name, "--agent", "script:answers.json", "--quiet", cwd=root, timeout=40)
    assert "Traceback" not in done.stderr and "actor_stopped" not in done.stderr, done.stderr
    if code is None:  # still a usable lock, or a record or request that is not one: the cast goes on
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1].startswith(f"castor: {code}: "), done.stderr
    assert not outside.exists(), "a link in the run directory was followed out of the project"
    listed = castor_cli(tmp_path, "casts", "--json", cwd=root, timeout=40)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["cast_id"] == run.name


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("how", "said", "verbs"), [
    ("link", "is a symbolic link", ("status", "abort", "continue", "recast")),
    ("directory", "is a directory", ("abort", "continue", "recast")),  # status's read-only probe can use it
])
def test_something_else_as_the_lease_file_is_named_and_the_advice_given_works(tmp_path, how, said, verbs):
    """A link or a directory planted as ``owner.lock``: every command that probes or takes the
    lease says the run directory is damaged, names the file and says to remove it -- it used to
    answer ``storage_unavailable`` (ELOOP, EISDIR), whose remedy (fix the storage, then ``castor
    recast``) met the same file again. Removing it is enough: ``castor continue`` completes the cast."""
    root, run = interrupted_cast(tmp_path)
    lease = run / "owner.lock"
    lease.unlink()
    if how == "link":
        lease.symlink_to(tmp_path / "outside-target")
    else:
        lease.mkdir()
    for verb in verbs:
        agent = ("--agent", "script:answers.json", "--quiet") if verb in ("continue", "recast") else ()
        done = castor_cli(tmp_path, verb, run.name, *agent, cwd=root, timeout=40)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert "once the storage is fixed" not in done.stderr, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("castor: state_corrupt: "), (verb, last)
        assert f"{lease} {said}" in last and "remove " in last, last
    assert not (tmp_path / "outside-target").exists()
    if how == "link":
        lease.unlink()  # what the message says to do
    else:
        lease.rmdir()
    done = castor_cli(tmp_path, "continue", run.name, "--agent", "script:answers.json", "--quiet", cwd=root,
                      timeout=40)
    assert done.returncode == 0, done.stderr
    assert "complete" in done.stdout


@pytest.mark.timeout(150)
def test_a_run_directory_replaced_by_a_file_mid_cast_reads_as_damaged_storage_not_an_unknown_id(tmp_path):
    """A cast's run directory moved away and a file written in its place while ``castor cast`` runs
    it: ``castor status ID`` (and ``abort``, ``recast``) said "Unknown pi-materia cast id", as for
    a typo. They say the cast's storage is damaged, name the path and what to type; the running
    command stops typed too."""
    import subprocess
    import sys

    from tests.cli.interrupted_cast import REPO
    from tests.support.waiting import wait_for

    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    (root / ".pi" / "pi-materia.json").write_text(json.dumps(ONE_SOCKET))
    (root / "slow.json").write_text(json.dumps([{"text": "late", "delay_ms": 60_000}]))
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    running = subprocess.Popen([sys.executable, "-m", "castor", "cast", "x", "--agent", "script:slow.json", "--quiet"],
                               cwd=root, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        casts = root / ".pi" / "pi-materia"
        run = wait_for(lambda: next((p for p in casts.glob("2*") if (p / "state.json").is_file()), None), 60,
                       "the cast's first save")
        run.rename(tmp_path / "moved-away")
        run.write_text("not a run directory")
        for command in (("status", run.name), ("abort", run.name),
                        ("recast", run.name, "--agent", "script:slow.json", "--quiet")):
            done = castor_cli(tmp_path, *command, cwd=root, timeout=40)
            assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
            last = done.stderr.strip().splitlines()[-1]
            assert last.startswith("castor: state_corrupt: "), (command, last)
            assert "storage is damaged" in last and f"`rm {run}`" in last and "Unknown" not in last, last
        _out, err = running.communicate(timeout=60)
        assert running.returncode == 1 and "Traceback" not in err, err
        assert "damaged" in err.strip().splitlines()[-1], err
    finally:
        if running.poll() is None:
            running.kill()
            running.communicate()


@pytest.mark.timeout(150)
def test_a_cli_json_linked_out_of_the_run_directory_is_never_read(tmp_path):
    """``cli.json`` (the agent a ``castor cast`` remembers) planted as a link to a file outside the
    run directory was read through the link, and the ``script:`` agent it named was replayed. The
    link is not followed: ``castor continue`` warns naming it and asks for ``--agent``."""
    root, run = interrupted_cast(tmp_path)
    outside = tmp_path / "outside-cli.json"
    outside.write_text(json.dumps({"agent": f"script:{root / 'answers.json'}"}))
    (run / "cli.json").unlink()
    (run / "cli.json").symlink_to(outside)
    done = castor_cli(tmp_path, "continue", run.name, "--quiet", cwd=root, timeout=40)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert f"castor: warning: {run / 'cli.json'} is a symbolic link" in done.stderr, done.stderr
    assert lines[-1].startswith("castor: invalid_params: no agent"), lines[-1]
    assert not (run / "sockets" / "Socket-1" / "1.md").exists(), "the linked note's agent ran the turn"


LEASE_REFUSED = r"""
import errno, os, sys
real_open = os.open
WRITE = os.O_RDWR | os.O_WRONLY


def refusing_open(path, flags, *args, **kwargs):  # the lease file refuses this user (as for a chmod 000
    # run directory of another user: castor's tests run as root, which no mode keeps out)
    if str(path).endswith("owner.lock") and (sys.argv[1] == "any" or flags & WRITE):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    return real_open(path, flags, *args, **kwargs)


os.open = refusing_open
from castor.cli.app import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("refused", "command"), [
    ("any", ("status",)),  # the command's own lease probe
    ("write", ("continue", "--agent", "script:answers.json", "--quiet")),  # the verb's take of the lease
])
def test_a_permission_error_on_a_run_directory_is_storage_unavailable_from_the_cli_as_from_the_store(
        tmp_path, refused, command):
    """One condition, one code: ``EACCES`` on a cast's lease file was ``forbidden`` from the CLI's
    own probe (``castor status``) and from the verb that takes the lease over (``data.reason
    not_writable``), where the store's own ``EACCES`` -- and the protocol's error table -- say
    ``storage_unavailable`` (``data.errno`` ``EACCES``)."""
    import subprocess
    import sys

    from tests.cli.interrupted_cast import REPO

    root, run = interrupted_cast(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CASTOR_AGENT": "", "HOME": str(tmp_path / "home"),
           "PI_MATERIA_PROFILE_DIR": str(tmp_path / "profile"), "MATERIA_CONFIG": ""}
    done = subprocess.run([sys.executable, "-c", LEASE_REFUSED, refused, command[0], run.name, *command[1:]],
                          cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("castor: storage_unavailable: "), last
    assert "EACCES" in last and f".pi/pi-materia/{run.name}/owner.lock" in last, last


@pytest.mark.timeout(150)
def test_a_run_directory_replaced_by_a_file_lists_as_unreadable_saying_so(tmp_path):
    """``castor casts`` dropped a cast whose run directory had become a file without a word (its
    listing took directories only): it lists it as unreadable with what happened and the ``rm``
    that drops it. Another file of the artifact root (not named as castor names a cast) stays out."""
    root, run = interrupted_cast(tmp_path)
    assert castor_cli(tmp_path, "casts", cwd=root).returncode == 0  # the index knows the cast
    for child in sorted(run.rglob("*"), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    run.rmdir()
    run.write_text("not a run directory")
    (run.parent / "NOTES").write_text("mine")
    listed = castor_cli(tmp_path, "casts", "--json", cwd=root, timeout=40)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["cast_id"] == run.name and row["status"] == "unreadable", row
    assert "storage is damaged" in row["failed_reason"] and f"`rm {run}`" in row["failed_reason"], row
    idless = castor_cli(tmp_path, "status", cwd=root, timeout=40)  # said "No pi-materia cast state in this session."
    assert idless.returncode == 1 and "1 unreadable" in idless.stderr and "storage is damaged" in idless.stderr, \
        idless.stderr
    run.unlink()  # what it says to do
    assert json.loads(castor_cli(tmp_path, "casts", "--json", cwd=root, timeout=40).stdout) == []


@pytest.mark.timeout(150)
def test_a_directory_in_place_of_usage_json_is_named_and_the_recast_it_advises_runs(tmp_path):
    """A directory planted as ``usage.json``: the cast completes but cannot write its last artifacts,
    and says ``castor recast ID`` writes them. The damage was named as the atomic write's temporary
    file (``.usage.json.PID.TAG.tmp``), which the user never sees, and the advised recast was refused
    ("complete and cannot be recast"). The damage names ``usage.json``; once it is removed, the
    recast writes the artifacts."""
    root, run = interrupted_cast(tmp_path)
    (run / "usage.json").unlink()
    (run / "usage.json").mkdir()
    done = castor_cli(tmp_path, "continue", run.name, "--agent", "script:answers.json", "--quiet", cwd=root)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    # The interrupted turn's usage record (a stopped turn that reported no usage) is written as the
    # cast resumes, so the damage is met there, before anything runs; a cast whose usage.json had no
    # turn to write met it at its end, completed, and said `castor recast ID` writes its artifacts.
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("castor: state_corrupt: ") and "usage.json is a directory" in last, done.stderr
    assert ".tmp" not in last and f"{run / 'usage.json'}" in last, done.stderr
    again = castor_cli(tmp_path, "recast", run.name, "--agent", "script:answers.json", "--quiet", cwd=root)
    last = again.stderr.strip().splitlines()[-1]
    assert again.returncode == 1 and last.startswith("castor: state_corrupt: "), again.stderr
    assert f"{run / 'usage.json'} is a directory" in last, last
    (run / "usage.json").rmdir()
    fixed = castor_cli(tmp_path, "recast", run.name, "--agent", "script:answers.json", "--quiet", cwd=root)
    assert fixed.returncode == 0, fixed.stderr
    assert (run / "usage.json").is_file()
