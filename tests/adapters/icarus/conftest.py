"""Fixtures for the Icarus adapter tests: the worker harness on the reference backend."""

from tests.support.icarus_worker import harness  # noqa: F401 - the worker tests' fixture, re-exported for this directory
