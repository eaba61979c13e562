"""The resume a failed ``castor recast ID --agent openai:...`` ends on, typed as shown, runs with the
agent the user gave: no ``openai:`` agent is remembered in the run directory (it is never taken from
the tree), so the closing hint repeats ``--agent SPEC`` (quoted for a shell). It used to name
``castor revive ID`` alone, which stopped at once on ``no agent``."""

from __future__ import annotations

import re
import shlex
import socket

from tests.cli.interrupted_cast import castor_cli, interrupted_cast


def _a_port_nothing_listens_on() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_failed_recast_with_an_openai_agent_names_that_agent_in_its_closing_hint(tmp_path):
    project, run = interrupted_cast(tmp_path)
    assert castor_cli(tmp_path, "abort", run.name, cwd=project).returncode == 0
    agent = f"openai:http://127.0.0.1:{_a_port_nothing_listens_on()}/v1#m"  # '#': quoted for the shell
    failed = castor_cli(tmp_path, "recast", run.name, "--agent", agent, "--quiet", cwd=project)
    assert failed.returncode == 1, failed.stderr
    closing = failed.stderr.strip().splitlines()[-1]
    hint = re.search(r"`(castor (?:recast|revive) [^`]*)` resumes it$", closing)
    assert hint, closing
    assert hint.group(1) == f"castor revive {run.name} --agent {shlex.quote(agent)}", closing
    assert shlex.split(hint.group(1))[-2:] == ["--agent", agent]


def test_a_resume_hint_names_no_agent_the_run_directory_remembers(tmp_path):
    """A ``script:`` agent is remembered in ``cli.json``: the hint stays as short as before."""
    project, run = interrupted_cast(tmp_path)
    stopped = castor_cli(tmp_path, "continue", run.name, "--agent", "script:esc.json", "--quiet", cwd=project)
    assert stopped.returncode == 1, stopped.stderr
    assert f"`castor continue {run.name}` runs it again" in stopped.stderr, stopped.stderr
    assert "--agent" not in stopped.stderr.strip().splitlines()[-1]


def test_a_continue_refused_for_an_ended_cast_names_the_recast_with_the_agent_given(tmp_path):
    project, run = interrupted_cast(tmp_path)
    assert castor_cli(tmp_path, "abort", run.name, cwd=project).returncode == 0
    agent = f"openai:http://127.0.0.1:{_a_port_nothing_listens_on()}/v1#m"
    refused = castor_cli(tmp_path, "continue", run.name, "--agent", agent, cwd=project)
    assert refused.returncode != 0, refused.stdout
    assert f"`castor recast {run.name} --agent {shlex.quote(agent)}` resumes it" in refused.stderr, refused.stderr
