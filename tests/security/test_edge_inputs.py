"""Inputs at the edge: CLI flags and environment variables get one line and exit status 2.

Every command of the real ``castor`` parser is run (found by introspection, so a new
command is covered without editing this file) with a bad log level on the command line and
in the environment; nothing may print a traceback, run, or write to stdout.
"""

from __future__ import annotations

import argparse
import subprocess

import pytest

from castor.cli import build_parser

from .conftest import castor_argv, serve_env

pytestmark = pytest.mark.timeout(120)


def _minimal_argv(name: str, sub: argparse.ArgumentParser) -> list[str]:
    """Arguments that make ``castor NAME ...`` parse (it would then run)."""
    argv = [name]
    for group in sub._mutually_exclusive_groups:
        if group.required:
            first = group._group_actions[0]
            argv.append(first.option_strings[0])
            if first.nargs != 0:
                argv.append("/nonexistent/castor.sock" if "socket" in first.dest else "x")
    for action in sub._actions:
        if action.option_strings and action.required:
            argv += [action.option_strings[0], "x"]
        elif not action.option_strings and action.nargs is None:
            argv.append("x")
    return argv


def _commands() -> list[list[str]]:
    parser = build_parser()
    sub_action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [_minimal_argv(name, sub) for name, sub in sub_action.choices.items()]


COMMANDS = _commands()


def _assert_one_line_usage_error(done: subprocess.CompletedProcess, needle: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("castor: invalid_params: ") and needle in lines[0], lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""


def _run(argv: list[str], tmp_path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(castor_argv(*argv), env={**serve_env(tmp_path), **env}, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_every_command_is_found():
    names = {argv[0] for argv in COMMANDS}
    assert {"serve", "inspect", "demo", "cast", "casts", "validate", "soak"} <= names


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_a_bad_log_level_flag_is_one_line_and_exit_2_for_every_command(argv, tmp_path):
    _assert_one_line_usage_error(_run(["--log-level", "bogus", *argv], tmp_path), "--log-level")


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_bad_log_environment_is_one_line_and_exit_2_for_every_command(argv, tmp_path):
    _assert_one_line_usage_error(_run(argv, tmp_path, CASTOR_LOG_LEVEL="verbose"), "CASTOR_LOG_LEVEL")
    _assert_one_line_usage_error(_run(argv, tmp_path, CASTOR_LOG_JSON="maybe"), "CASTOR_LOG_JSON")
    assert not (tmp_path / ".pi").exists()  # nothing ran


def test_a_log_level_of_digits_int_cannot_read_is_a_usage_error_not_a_traceback(tmp_path):
    """"²" is a digit to str.isdigit, and int() refuses it: a traceback at every command's start."""
    _assert_one_line_usage_error(_run(["casts", "--cwd", str(tmp_path)], tmp_path, CASTOR_LOG_LEVEL="²"),
                                 "CASTOR_LOG_LEVEL")


def test_the_runtime_a_harness_starts_fails_cleanly_on_a_bad_environment(tmp_path):
    """What the Pi extension runs: ``castor serve --stdio`` with stdin/stdout as pipes."""
    proc = subprocess.Popen(castor_argv("serve", "--stdio"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**serve_env(tmp_path), "CASTOR_LOG_LEVEL": "verbose"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert out == b""  # the protocol stream stays clean
    assert err.decode().count("\n") == 1 and err.startswith(b"castor: invalid_params: CASTOR_LOG_LEVEL: ")


@pytest.mark.parametrize("value", ["debug", "INFO", " warning ", "10", "0"])
def test_good_log_levels_are_accepted(value, tmp_path):
    done = _run(["casts", "--cwd", str(tmp_path)], tmp_path, CASTOR_LOG_LEVEL=value)
    assert done.returncode == 0, done.stderr
    done = _run(["--log-level", value, "casts", "--cwd", str(tmp_path)], tmp_path, CASTOR_LOG_JSON="1")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("argv, needle", [
    (["serve", "--stdio", "--utility-slots", "0"], "--utility-slots"),
    (["serve", "--stdio", "--utility-slots", "1e9"], "--utility-slots"),
    (["serve", "--stdio", "--max-casts-per-session", "-3"], "--max-casts-per-session"),
    (["serve", "--stdio", "--max-connections", "0"], "--max-connections"),
    (["serve", "--stdio", "--user-turn-timeout", "inf"], "--user-turn-timeout"),
    (["serve", "--tcp", "127.0.0.1:1", "--hello-timeout", "nan"], "--hello-timeout"),
    (["serve", "--tcp", "127.0.0.1:1", "--idle-timeout", "-1"], "--idle-timeout"),
    (["serve", "--tcp", "127.0.0.1:99999"], "--tcp"),
    (["serve", "--tcp", "no-port"], "--tcp"),
    (["serve", "--socket", "/" + "a" * 200], "--socket"),
    (["inspect", "--socket", "x", "--interval", "0"], "--interval"),
    (["serve", "--stdio", "--token-file", "/etc/hostname"], "--stdio"),
    (["serve", "--socket", "s.sock", "--token-file", "t"], "--require-token"),
])
def test_bad_numbers_addresses_and_paths_are_one_line_and_exit_2(argv, needle, tmp_path):
    _assert_one_line_usage_error(_run(argv, tmp_path), needle)


@pytest.mark.parametrize("argv, code", [
    (["serve", "--tcp", "10.1.2.3:9000"], "forbidden"),
    (["serve", "--socket", "/nonexistent-dir/castor.sock"], "invalid_config"),
    (["serve", "--tcp", "127.0.0.1:1", "--token-file", "/nonexistent.token"], "invalid_config"),
    (["inspect", "--tcp", "127.0.0.1:1", "--token-file", "/nonexistent.token"], "invalid_config"),
    (["inspect", "--tcp", "127.0.0.1:1", "--token-file", "/etc/hostname"], "forbidden"),
])
def test_values_refused_before_the_runtime_starts_are_one_line_and_exit_2(argv, code, tmp_path):
    done = _run(argv, tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"castor: {code}: ") and "Traceback" not in done.stderr
