"""The ``castor`` command starts fast: building its parser imports only argparse and the commands'
option definitions, so ``--version``, ``--help`` and a refused flag load nothing of the runtime
(every command runs in a fresh process, and the suite starts ~150 of them); and the commands that
only read files (``casts``, ``status``, ``validate``) load no runtime, actor system, console or
Icarus code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from castor.version import __version__

REPO = Path(__file__).resolve().parents[2]

#: What building the parser must not import (each costs tens of milliseconds, or pulls in more that does).
NOT_FOR_THE_PARSER = (
    "castor.actors", "castor.adapters", "castor.client", "castor.composition", "castor.console",
    "castor.domain", "castor.endpoint", "castor.logs", "castor.messages", "castor.ports", "castor.runtime",
    "castor.supervision", "castor.testing", "castor.tree",
    "loguru", "msgpack", "psutil", "pydantic", "pydantic_core", "pykka", "rich",
)
#: What a command that only reads a project's files must not import.
NOT_FOR_READING_FILES = (
    "castor.actors.icarus", "castor.adapters.icarus", "castor.client", "castor.composition", "castor.console",
    "castor.domain.icarus", "castor.endpoint", "castor.runtime", "castor.supervision", "castor.testing",
    "pykka", "rich",
)


def _imported(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``python -X importtime -m castor ARGV``; its result and the modules it imported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "castor", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=50, env={**os.environ, "PYTHONPATH": str(REPO)})
    modules = {line.rpartition("|")[2].strip() for line in proc.stderr.splitlines()
               if line.startswith("import time:")}
    assert "castor.cli.app" in modules, proc.stderr[-2000:]  # the report was parsed
    return proc, modules


#: What the parser may import of those packages: modules of names alone, which import nothing
#: (the keys of a cast's cli.json that more than the CLI writes; test_names_the_parser_may_read...).
THE_PARSER_MAY_READ = ("castor.ports", "castor.ports.cli_note")


def _among(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules
                  if any(m == p or m.startswith(p + ".") for p in packages) and m not in THE_PARSER_MAY_READ)


@pytest.mark.timeout(60)
def test_names_the_parser_may_read_import_nothing_else(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import castor.ports.cli_note"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=50, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    castor_modules = {line.rpartition("|")[2].strip() for line in proc.stderr.splitlines()
                      if line.startswith("import time:")} - set(sys.builtin_module_names)
    assert {m for m in castor_modules if m.startswith("castor")} == {"castor", "castor.version", *THE_PARSER_MAY_READ}
    assert _among(castor_modules, NOT_FOR_THE_PARSER) == []  # no pydantic, loguru, msgpack, ...



@pytest.mark.timeout(60)
def test_version_imports_nothing_of_the_runtime(tmp_path: Path) -> None:
    proc, modules = _imported(["--version"], tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == f"castor {__version__}", proc.stdout + proc.stderr[-2000:]
    assert _among(modules, NOT_FOR_THE_PARSER) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["cast", "--help"], ["soak", "--help"],
                                  ["inspect", "--help"], ["casts", "--limit", "0"]])
def test_help_and_a_refused_flag_import_nothing_of_the_runtime(tmp_path: Path, argv: list[str]) -> None:
    proc, modules = _imported(argv, tmp_path)
    assert proc.returncode == (2 if "--limit" in argv else 0), proc.stdout + proc.stderr[-2000:]
    assert _among(modules, NOT_FOR_THE_PARSER) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [["casts"], ["status", "latest"], ["validate", "config.json"]])
def test_the_commands_that_read_files_import_no_runtime_console_or_icarus(tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    proc, modules = _imported(argv, tmp_path)
    assert proc.returncode == (1 if argv[0] == "status" else 0), proc.stdout + proc.stderr[-2000:]
    assert "castor.cli.materia" in modules and "castor.adapters.materia.config_loader" in modules  # it ran
    assert _among(modules, NOT_FOR_READING_FILES) == []


@pytest.mark.timeout(60)
def test_the_parsers_copies_match_their_sources() -> None:
    """The numbers the CLI declares itself (so its parser imports no pydantic) are the session
    component's."""
    from castor.cli import common
    from castor.ports.session_component import DEFAULT_MEMORY_RETURN_S, MAX_MEMORY_RETURN_S

    assert (common.DEFAULT_MEMORY_RETURN_S, common.MAX_MEMORY_RETURN_S) == (DEFAULT_MEMORY_RETURN_S,
                                                                           MAX_MEMORY_RETURN_S)


@pytest.mark.timeout(60)
def test_an_interrupt_while_a_command_loads_is_one_line_and_exit_130(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C landing before the command runs (its first imports, logging's set-up) ends the
    command as one landing inside it does: ``castor: interrupted``, exit 130, no traceback."""
    import castor.logs
    from castor.cli.app import main

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(castor.logs, "configure_logging", interrupted)
    assert main(["casts"]) == 130
    assert capsys.readouterr().err == "castor: interrupted\n"
