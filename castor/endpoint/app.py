"""Build the runtime's Dispatcher: every method group wired to one Runtime."""

from __future__ import annotations

from castor.endpoint.dispatch import Dispatcher
from castor.endpoint.methods.icarus import register_icarus_methods
from castor.endpoint.methods.materia import register_materia_methods
from castor.endpoint.methods.ops import register_ops_methods
from castor.endpoint.methods.session import register_session_methods
from castor.runtime import Runtime

HARNESS_CAPABILITIES = {"casts", "icarus", "inspection"}


def build_dispatcher(runtime: Runtime) -> Dispatcher:
    dispatcher = Dispatcher(
        capabilities=set(HARNESS_CAPABILITIES) | ({"faults"} if runtime.settings.allow_faults else set())
    )
    register_session_methods(dispatcher, runtime)
    register_ops_methods(dispatcher, runtime)
    register_materia_methods(dispatcher, runtime)
    register_icarus_methods(dispatcher, runtime)
    return dispatcher
