"""A command line castor cannot read is refused with one line naming what is wrong, exit 2."""

from __future__ import annotations

import pytest

from castor.cli.app import main


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("argv", "said"), [
    (["--bogus"], "unknown option: --bogus (see castor --help)"),
    (["-x"], "unknown option: -x (see castor --help)"),
    (["serve", "--bogus"], "unknown option: --bogus (see castor serve --help)"),
    (["--bogus", "serve"], "unknown option: --bogus"),
    (["status", "--bogus", "--worse"], "unknown options: --bogus --worse (see castor status --help)"),
    (["serve", "--stdio", "extra"], "unrecognized arguments: extra (see castor serve --help)"),
])
def test_an_unknown_option_is_named_even_when_something_required_is_missing_too(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse checks the required arguments first: ``castor --bogus`` said ``required: COMMAND``
    and ``castor serve --bogus`` asked for an endpoint, neither naming ``--bogus``."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("castor: invalid_params: ") and said in err and err.count("\n") == 1, err


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("argv", "said"), [
    ([], "the following arguments are required: COMMAND (see castor --help)"),
    (["serve"], "one of the arguments --stdio --socket --tcp is required (see castor serve --help)"),
    (["cast"], "the following arguments are required: REQUEST (see castor cast --help)"),
])
def test_with_nothing_unknown_what_is_missing_is_said_as_before(argv: list[str], said: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("argv", "said"), [
    (["cast", "x", "--agent", "bogus"], "got 'bogus' (see castor cast --help)"),
    (["recast", "--agent", "script:"], "(see castor recast --help)"),
    (["soak", "--ray-hosts", "2"], "(see castor soak --help)"),
])
def test_a_value_refused_after_parsing_points_at_its_own_command_help(argv: list[str], said: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """An ``--agent`` (or ``CASTOR_AGENT``) or a backend flag refused once the line is parsed said
    "see castor --help", whose text describes neither; the subcommand's help does (the scripted
    agent's file format is in ``castor cast --help``)."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("castor: invalid_params: ") and said in err and err.count("\n") == 1, err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv", [
    ["cast", "x", "--config", ""], ["cast", "x", "--cwd", "  "], ["casts", "--cwd", ""],
    ["status", "--config", ""], ["grid", "--config", ""], ["recast", "--cwd", ""],
])
def test_an_empty_config_or_project_path_is_refused_not_taken_for_the_default(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A script passing an unset ``$CFG`` (``--config "$CFG"``) ran on ``$MATERIA_CONFIG`` or the
    project's own config, and ``--cwd ""`` on the current directory, without a word."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("castor: invalid_params: argument --") and "an empty path" in err, err
