"""``castor demo`` as a first-time user runs it: a fresh directory, stdout piped, nothing else.

The demo must keep its evidence (a named work dir it prints), print paths that survive a pipe
(no wrapping, no ellipsis), keep the injected crashes' tracebacks and ERROR lines off the
terminal (in the log file it names), and end with the commands to look at what it left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CASTOR = [sys.executable, "-m", "castor"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    env.pop("CASTOR_LOG_LEVEL", None)
    env.pop("CASTOR_LOG_JSON", None)
    return env


def _run(args: list[str], cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CASTOR, *args], cwd=str(cwd), env=_env(tmp_path), capture_output=True, text=True,
                          timeout=90)


@pytest.mark.timeout(120)
def test_demo_keeps_a_named_workdir_prints_whole_paths_and_keeps_tracebacks_off_the_terminal(tmp_path):
    cwd = tmp_path / "here"
    cwd.mkdir()
    done = _run(["demo"], cwd, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    # Nothing on the terminal looks like breakage: the crashes were injected on purpose.
    assert "Traceback" not in out + done.stderr
    assert "ERROR" not in out + done.stderr
    assert done.stderr.strip() == ""
    kept = re.search(r"^kept: (.+)$", out, re.M)
    log = re.search(r"^log:  (.+)$", out, re.M)
    assert kept and log
    root, log_path = Path(kept.group(1)), Path(log.group(1))
    assert root.parent == cwd and root.name.startswith("castor-demo-") and root.is_dir()
    assert log_path == root / "demo.log"
    logged = log_path.read_text()
    assert "InjectedCrash" in logged and "Traceback" in logged and "ActorKilled" in logged
    # Each fault the demo injects is one ✓ line.
    for fault in ("injected crash → restarted by its supervisor", "killed SocketActor",
                  "retrieval past timeoutMs"):
        lines = [ln for ln in out.splitlines() if fault in ln and ln.lstrip().startswith("✓")]
        assert len(lines) == 1, fault
    # Every run dir it names exists, printed whole (a wrapped or cut path would not).
    run_dirs = re.findall(r"(/\S+/\.pi/pi-materia/[0-9T:-]+Z)\b", out)
    assert len(set(run_dirs)) == 6
    for d in set(run_dirs):
        assert (Path(d) / "events.jsonl").is_file(), d
    assert "…" not in out
    # It ends with the commands to look at what it left, and they work.
    commands = re.findall(r"^  (castor casts --cwd .+)$", out, re.M)
    assert len(commands) == 3
    listed = _run(commands[0].split()[1:] + ["--json"], cwd, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 2
    assert "--console 127.0.0.1:" in out.splitlines()[-1]
    # A second run gets a fresh directory; the first is untouched.
    again = _run(["demo", "--quiet"], cwd, tmp_path)
    assert again.returncode == 0
    second = Path(re.search(r"^kept: (.+)$", again.stdout, re.M).group(1))
    assert second != root and second.is_dir() and root.is_dir()


@pytest.mark.timeout(120)
def test_demo_writes_into_the_workdir_it_is_given(tmp_path):
    work = tmp_path / "my run"  # a space: the printed commands quote it
    done = _run(["demo", "--quiet", "--workdir", str(work)], tmp_path, tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"kept: {work}" in done.stdout
    assert (work / "demo.log").is_file() and (work / "casts" / "demo-a").is_dir()
    assert f"castor casts --cwd '{work}/casts/demo-a'" in done.stdout


def test_demo_refuses_a_workdir_that_is_a_file(tmp_path):
    target = tmp_path / "afile"
    target.write_text("x")
    done = _run(["demo", "--quiet", "--workdir", str(target)], tmp_path, tmp_path)
    assert done.returncode != 0
    assert done.stderr.strip().startswith("castor: conflict:")
    assert target.read_text() == "x"


@pytest.mark.timeout(120)
def test_the_json_log_names_the_actor_and_message_type_on_every_line(tmp_path):
    work = tmp_path / "run"
    done = _run(["--log-json", "demo", "--quiet", "--workdir", str(work)], tmp_path, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = (work / "demo.log").read_text().splitlines()
    assert len(lines) >= 5
    records = [json.loads(line)["record"] for line in lines]  # every line is one JSON object
    for record in records:
        assert record["extra"]["actor"] and record["extra"]["msg_type"], record["message"]
        assert record["level"]["name"] and record["time"]["timestamp"]
    crash = next(r for r in records if "actor crashed: InjectedCrash" in r["message"])
    assert crash["extra"]["actor"] == "/root/math/squarer" and crash["extra"]["msg_type"] == "demo.square"
    assert crash["exception"]["type"] == "InjectedCrash"
    killed = next(r for r in records if "ActorKilled" in r["message"])
    assert killed["extra"]["actor"].startswith("/root/session/demo-b/socket/") and killed["extra"]["msg_type"] == "-"


@pytest.mark.timeout(60)
def test_a_section_the_disk_stops_reads_as_a_storage_error_not_pythons_errno_text(tmp_path, monkeypatch, capsys):
    """`castor demo --workdir` on a full disk: a section's row read ``OSError: [Errno 28] No space
    left on device`` (Python's text, no file named, no stable code). It reads as castor's errors
    do: the code, the file relative to the workdir, what the system said, the errno's name."""
    import errno

    from castor.messages.errors import StorageUnavailable
    from castor.testing import demo

    def full(_report, root):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(root / "casts" / "demo-a" / ".pi" / "x.json"))

    def unnamed(_report, _root):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def typed(_report, _root):
        raise StorageUnavailable("storage unavailable: cannot write on .pi/state.json (ENOSPC: No space left)")

    monkeypatch.setattr(demo, "_sections", lambda: [("casts", full), ("icarus", unnamed), ("more", typed)])
    assert demo.run_demo(workdir=str(tmp_path / "w"), quiet=True) == 1
    out = capsys.readouterr().out
    assert "[Errno" not in out and "OSError" not in out, out
    assert "storage_unavailable: casts/demo-a/.pi/x.json: No space left on device (ENOSPC)" in out, out
    assert "storage_unavailable: No space left on device (ENOSPC)" in out, out
    assert "storage_unavailable: storage unavailable: cannot write on .pi/state.json" in out, out
