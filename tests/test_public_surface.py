"""The embedding API of ``castor``: exactly these names, each resolving and documented.

Changing ``castor.__all__`` is an API change: this test must be edited with it, on purpose.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import castor
import castor.messages.errors as errors

EMBEDDING_API = {
    # the runtime, its settings, and what a session is opened with
    "Runtime", "RuntimeSettings", "SessionInfo", "HarnessLink",
    # the runtime with materia and Icarus over their file and process adapters (what `castor serve` runs)
    "build_runtime",
    # the actor system under it, and the endpoint's client
    "ActorSystem", "Client",
    # the error model: the code enum, the base and every typed error
    "ErrorCode", "CastorError",
    "ActorCrashed", "ActorStopped", "Cancelled", "Conflict", "Forbidden", "Internal", "InvalidConfig",
    "InvalidFrame", "InvalidMessage", "InvalidParams", "MailboxFull", "NotFound", "Retired",
    "StorageUnavailable", "Timeout", "Unauthenticated", "UnknownMethod", "WorkerCrashed", "WorkerRetired",
}


def test_all_is_exactly_the_embedding_api():
    assert sorted(castor.__all__) == list(castor.__all__), "__all__ is kept sorted"
    assert set(castor.__all__) == EMBEDDING_API
    assert len(castor.__all__) == len(EMBEDDING_API), "no name twice"
    assert set(vars(castor)["_WHERE"]) == EMBEDDING_API, "the lazy table loads exactly the exported names"


def test_every_name_resolves_to_the_object_of_its_home_module_and_is_documented():
    for name in castor.__all__:
        value = getattr(castor, name)
        home = sys.modules[value.__module__]
        assert getattr(home, name) is value, name
        doc = inspect.getdoc(value) if not inspect.isclass(value) else value.__dict__.get("__doc__")
        assert doc and doc.strip(), f"castor.{name} has no docstring of its own"


def test_every_typed_error_of_the_error_model_is_exported():
    typed = {name for name, value in vars(errors).items()
             if inspect.isclass(value) and issubclass(value, errors.CastorError)}
    assert typed <= set(castor.__all__), typed - set(castor.__all__)


def test_from_castor_import_star_gives_the_api_and_an_unknown_name_is_an_attribute_error():
    namespace: dict[str, object] = {}
    exec("from castor import *", namespace)  # noqa: S102 - a fixed literal: what `import *` exports
    assert EMBEDDING_API <= set(namespace)
    try:
        castor.NoSuchName  # noqa: B018 - the attribute access is what is tested
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:
        raise AssertionError("castor.NoSuchName resolved")


def test_importing_castor_loads_none_of_the_runtime():
    """The names are lazy: the CLI, the Icarus worker program and ``python -m castor --help`` do
    not pay for the runtime by importing the package."""
    code = ("import sys, castor; "
            "heavy = [m for m in ('castor.runtime', 'castor.supervision', 'castor.client', 'pydantic') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
