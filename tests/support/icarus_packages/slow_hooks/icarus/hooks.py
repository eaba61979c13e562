"""Hooks of the slow fake (see the package's docstring)."""

import os
import time


def on_session_start(**_kwargs):
    return None


def pre_llm_call(**_kwargs):
    time.sleep(float(os.environ.get("ICARUS_FAKE_SLOW_S", "600")))
    return {"context": "[facts]\n  answered late"}


def post_llm_call(**_kwargs):
    return None


def on_session_end(**_kwargs):
    time.sleep(float(os.environ.get("ICARUS_FAKE_SLOW_END_S", "0")))
    return None
