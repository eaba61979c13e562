"""Build the runtime's Dispatcher: every method group wired to one Runtime."""

from __future__ import annotations

from castor.endpoint.dispatch import Dispatcher
from castor.endpoint.methods.ops import register_ops_methods
from castor.endpoint.methods.session import register_session_methods
from castor.runtime import Runtime

HARNESS_CAPABILITIES = {"casts", "icarus", "inspection"}


def build_dispatcher(runtime: Runtime) -> Dispatcher:
    dispatcher = Dispatcher(capabilities=set(HARNESS_CAPABILITIES) | ({"faults"} if runtime.settings.allow_faults else set()))
    register_session_methods(dispatcher, runtime)
    register_ops_methods(dispatcher, runtime)
    for module_name, function in (("castor.endpoint.methods.materia", "register_materia_methods"),
                                  ("castor.endpoint.methods.icarus", "register_icarus_methods")):
        try:
            module = __import__(module_name, fromlist=[function])
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # TODO(lead): remove once both groups have landed
        getattr(module, function)(dispatcher, runtime)
    return dispatcher
