"""The failure text of a utility command, in pi-materia's wording: the command shown as its
JSON-quoted arguments, "failed ... exited with code N" (a signal: "code signal X"), the stderr
summary (JavaScript whitespace collapsed, at most 800 UTF-16 units, "<empty>" when blank), and
both artifact paths."""

from __future__ import annotations

import pytest

from .scripted import Driver, config, resolved

pytestmark = pytest.mark.timeout(10)

ARGS = ["node", "-e", 'console.error("x"); process.exit(7)']
QUOTED = '"node" "-e" "console.error(\\"x\\"); process.exit(7)"'
WHERE = "stdout: sockets/Socket-1/1.command.stdout.txt; stderr: sockets/Socket-1/1.command.stderr.txt"


def _failed(**outcome: object) -> str:
    d = Driver(resolved(config({"Socket-1": {"type": "utility", "command": ARGS, "timeoutMs": 50}})))
    d.utility("partial", **outcome)
    assert d.state.failed and d.state.failed_reason
    return d.state.failed_reason


def test_a_nonzero_exit_names_the_quoted_command_code_stderr_and_artifacts() -> None:
    assert _failed(stderr="bad  things\n happened\n", exit_code=7) == (
        f'Utility command failed for socket "Socket-1": {QUOTED} exited with code 7. '
        f"stderr: bad things happened. {WHERE}")


def test_a_signal_and_an_empty_or_truncated_stderr_are_worded_as_pi_materia_words_them() -> None:
    assert f"{QUOTED} exited with code signal SIGKILL. stderr: <empty>. " in _failed(exit_code=None,
                                                                                     signal="SIGKILL")
    long = _failed(stderr="\ufeff" + "é" * 900, exit_code=1, stderr_truncated=True)
    assert f"stderr: {'é' * 800} (truncated). " in long  # a BOM is JavaScript whitespace: trimmed


def test_a_timeout_names_the_quoted_command() -> None:
    assert _failed(timed_out=True, exit_code=None, signal="SIGTERM") == (
        f'Utility command timed out for socket "Socket-1" after 50ms: {QUOTED}. {WHERE}')


def test_an_unsupported_advance_condition_fails_the_cast_with_pi_materias_text() -> None:
    d = Driver(resolved(config({"Socket-1": {"type": "agent", "materia": "J", "parse": "json",
                                             "advance": {"cursor": "c", "items": "state.items",
                                                         "when": "$.done >= 3"}}})), data={"items": [1, 2]})
    d.reply('{"done": 3}')
    assert d.state.failed and "Unsupported Materia condition: $.done >= 3" in (d.state.failed_reason or "")
