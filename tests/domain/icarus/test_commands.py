"""The /icarus command grammar."""

from __future__ import annotations

import pytest

from castor.domain.icarus.commands import (
    USAGE,
    CommandError,
    ContextCommand,
    ContextDefaultCommand,
    HooksCommand,
    InspectCommand,
    parse_command,
)
from castor.messages.errors import ErrorCode


@pytest.mark.parametrize(("text", "expected"), [
    ("", HooksCommand(action="toggle")),
    (None, HooksCommand(action="toggle")),
    ("  TOGGLE ", HooksCommand(action="toggle")),
    ("on", HooksCommand(action="on")),
    ("enable", HooksCommand(action="on")),
    ("off", HooksCommand(action="off")),
    ("Disable", HooksCommand(action="off")),
    ("status", HooksCommand(action="status")),
    ("context", ContextCommand(action="toggle")),
    ("context toggle", ContextCommand(action="toggle")),
    ("context status", ContextCommand(action="status")),
    ("context visible", ContextCommand(action="show")),
    ("context enable", ContextCommand(action="show")),
    ("context hidden", ContextCommand(action="hide")),
    ("context off", ContextCommand(action="hide")),
    ("context default", ContextDefaultCommand(action="status")),
    ("context default status", ContextDefaultCommand(action="status")),
    ("context default status user", ContextDefaultCommand(action="status", scope="global")),
    ("context default local", ContextDefaultCommand(action="status", scope="project")),
    ("context default show", ContextDefaultCommand(action="show")),
    ("context default visible project", ContextDefaultCommand(action="show", scope="project")),
    ("context default hide global", ContextDefaultCommand(action="hide", scope="global")),
    ("context default disable user", ContextDefaultCommand(action="hide", scope="global")),
    ("context default toggle local", ContextDefaultCommand(action="toggle", scope="project")),
    ("config", InspectCommand(what="config")),
    ("schema", InspectCommand(what="schema")),
])
def test_valid_commands(text, expected):
    assert parse_command(text) == expected


@pytest.mark.parametrize("text", [
    "on now", "moon", "context default hide moon", "context default hide project extra", "context maybe",
    "context show now", "context default wat", "config extra", "status please", "context default global extra",
    "context default toggle everywhere",
])
def test_invalid_commands_are_typed_errors_with_usage(text):
    with pytest.raises(CommandError) as info:
        parse_command(text)
    assert info.value.code == ErrorCode.INVALID_PARAMS
    assert info.value.data["usage"] == USAGE and USAGE in info.value.message


def test_only_default_writes_are_writes():
    assert parse_command("context default hide").writes
    assert not parse_command("context default status").writes


@pytest.mark.parametrize("text", ["on {w}", "context {w}", "context default {w}", "context default hide {w}",
                                  "context default hide global {w}", "{w}"])
def test_a_long_word_is_echoed_clipped_whatever_its_place(text):
    """Only an unknown first word was clipped: ``/icarus on <a pasted megabyte>`` answered with the
    whole megabyte in the warning Pi shows."""
    with pytest.raises(CommandError) as info:
        parse_command(text.format(w="y" * 1_000_000))
    assert len(info.value.message) < len(USAGE) + 200, len(info.value.message)
    assert "(1000000 characters)" in info.value.message


@pytest.mark.parametrize("text", ["on {w}", "context {w}", "context default {w}", "context default hide {w}",
                                  "{w}"])
@pytest.mark.parametrize(("word", "shown"), [("\u202eevil", "\\u202eevil"), ("bell\x07", "bell\\x07"),
                                             ("it's", "it's")])
def test_an_echoed_word_is_escaped_once_and_quoted_once(text, word, shown):
    """Each message quoted ``repr()`` of the word already escaped for one line, so a control or bidi
    character read with every backslash doubled (``'\\\\u202eevil'``), and a quote switched the quotes."""
    with pytest.raises(CommandError) as info:
        parse_command(text.format(w=word))
    assert f"'{shown}'" in info.value.message, info.value.message
    assert "\\\\" not in info.value.message
