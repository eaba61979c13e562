"""Hooks that end the worker process (see the package's docstring)."""

from ._fate import die_unless_healthy


def on_session_start(**_kwargs):
    return die_unless_healthy(None)


def pre_llm_call(**_kwargs):
    return die_unless_healthy({"context": "[facts]\n  the package answers again"})


def post_llm_call(**_kwargs):
    return die_unless_healthy(None)


def on_session_end(**_kwargs):
    return die_unless_healthy(None)
