"""``--backend`` and ``--ray-address`` for the commands that run casts (serve, cast, soak).

Importing this module imports nothing but argparse, re and :mod:`castor.scaleout`'s backend names:
the CLI builds its parser from :func:`add_backend_flags` without loading pydantic or any runtime
code (tests/cli/test_cli_startup.py); what a flag starts is imported when it starts it."""

from __future__ import annotations

import argparse
import re
from typing import Any

from castor.scaleout import BACKENDS, RAY_MINOR

#: The cast hosts ``castor soak --backend ray`` starts on the cluster it makes for itself (``--ray-hosts``
#: chooses): fewer than that cluster's 3 nodes, so a node removal can take a node that runs no host
#: as well as one that does. Defined here, where the parser reads it: building it imports no soak code.
SOAK_RAY_HOSTS = 2


def add_backend_flags(parser: argparse.ArgumentParser, *, hosts_default: str = "one per node") -> None:
    """The three flags; ``hosts_default`` is what ``--ray-hosts`` defaults to, as its help says it
    (``castor soak`` starts its own cluster with a fixed number of cast hosts)."""
    parser.add_argument("--backend", choices=BACKENDS, default="local",
                        help="where casts run: in this process (local, the default) or on a Ray cluster (ray; "
                             "needs the castor[ray] extra)")
    parser.add_argument("--ray-address", metavar="ADDR", default=None,
                        help="with --backend ray: a running cluster's address (default: start a local one)")
    parser.add_argument("--ray-hosts", metavar="N", type=int, default=None,
                        help=f"with --backend ray: cast hosts to start (default: {hosts_default})")


def backend_flag_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the backend flags, checked before anything starts (a usage error)."""
    backend = getattr(args, "backend", "local")
    if backend != "ray":
        if getattr(args, "ray_address", None) or getattr(args, "ray_hosts", None) is not None:
            return "--ray-address and --ray-hosts need --backend ray"
        return None
    address = getattr(args, "ray_address", None)
    if address is not None and _address_parts(address) is None:
        return (f"--ray-address must be a running cluster's HOST:PORT (its GCS, e.g. 10.0.0.5:6379), "
                f"'auto', or ray://HOST:PORT, got {address!r}")
    hosts = getattr(args, "ray_hosts", None)
    if hosts is not None and not 1 <= hosts <= 1024:
        return f"--ray-hosts must be between 1 and 1024, got {hosts}"
    try:
        import ray
    except ImportError:
        return "--backend ray needs Ray: pip install 'castor[ray]'"
    wanted = ".".join(map(str, RAY_MINOR))
    installed = str(getattr(ray, "__version__", "unknown"))
    if installed.split(".")[:2] != wanted.split("."):
        return (f"--backend ray needs Ray {wanted}.x (the minor castor is built and tested with), found Ray "
                f"{installed}: pip install 'castor[ray]'")
    if address is not None and address.strip().startswith("ray://"):
        import importlib

        try:  # Ray Client's transport, which Ray installs only with its client extra (no type stubs)
            importlib.import_module("grpc")
        except ImportError:
            return ("--ray-address ray://... needs Ray Client's package (grpcio), which castor's extra brings: "
                    "pip install 'castor[ray]'")
    return None


def backend_flags(args: argparse.Namespace) -> list[str]:
    """The flags that run a command's casts where they run (``--backend ray`` and its
    ``--ray-address``/``--ray-hosts``; never a token, which Ray reads from its environment): what a
    cast's cli.json records so a resuming command names them. None for this machine."""
    if getattr(args, "backend", "local") != "ray":
        return []
    flags = ["--backend", "ray"]
    if args.ray_address:
        flags += ["--ray-address", args.ray_address]
    if args.ray_hosts is not None:
        flags += ["--ray-hosts", str(args.ray_hosts)]
    return flags


def valid_backend_flags(flags: object) -> bool:
    """Whether ``flags`` are backend flags as ``castor cast --backend ray`` records them with a cast:
    ``--backend ray``, then at most a valid ``--ray-address`` and a ``--ray-hosts`` in range."""
    if not isinstance(flags, list) or flags[:2] != ["--backend", "ray"] or len(flags) % 2:
        return False
    seen: set[str] = set()
    for name, value in zip(flags[2::2], flags[3::2], strict=True):
        if name in seen or not isinstance(value, str):
            return False
        seen.add(name)
        if name == "--ray-address" and _address_parts(value) is None:
            return False
        if name == "--ray-hosts" and not (value.isascii() and value.isdigit() and 1 <= int(value) <= 1024):
            return False
        if name not in ("--ray-address", "--ray-hosts"):
            return False
    return True


def make_backend(args: argparse.Namespace, host_runtime: dict[str, Any] | None = None) -> Any:
    """The Ray backend the flags ask for, or None for the local one (Ray is then never imported).
    ``host_runtime``: runtime settings every cast host's runtime gets beside the backend's own (what
    ``castor serve`` records in its casts' cli.json)."""
    problem = backend_flag_problem(args)
    if problem is not None:
        from castor.messages.errors import InvalidParams

        raise InvalidParams(problem, data={"reason": "bad_flag"})
    if getattr(args, "backend", "local") != "ray":
        return None
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings

    if args.ray_address:
        check_reachable(args.ray_address)
    return RayBackend(RayBackendSettings(address=args.ray_address, hosts=args.ray_hosts), host_runtime=host_runtime)


#: How long the cluster's address gets to accept a connection before castor says it cannot be reached.
REACH_TIMEOUT_S = 5.0


def _address_parts(address: str) -> tuple[str, int] | None | tuple[()]:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; ``()`` for ``auto`` (Ray finds the
    cluster itself); None when it is neither."""
    text = address.strip()
    if text == "auto":
        return ()
    if text.startswith("ray://"):
        text = text[len("ray://"):]
    host, sep, port = text.rpartition(":")
    if not sep or not _HOST.fullmatch(host) or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


#: A host name, an IPv4 address or a bracketed IPv6 one: no scheme (``http://``), path, user or space,
#: which Ray would take for part of a host name (and castor reported the address unreachable).
_HOST = re.compile(r"[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?\]")


#: What a client sends first on an HTTP/2 connection (gRPC, which a Ray GCS speaks): the preface
#: and an empty SETTINGS frame. A GCS answers with its own SETTINGS frame at once.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x04


def check_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise a typed error unless a gRPC server (as a Ray cluster's GCS is) answers at ``address``
    within ``timeout_s``. Ray's own connect retries for minutes on an address nobody listens at
    (it only logs), and for ever on one that accepts and never answers (a wrong port of another
    service), so a wrong --ray-address hung the command; this answers in seconds."""
    import socket

    from castor.messages.errors import InvalidParams, NotFound, Timeout

    parts = _address_parts(address)
    shown = address
    if parts == ():  # auto: probe what Ray would join (it hung on a dead or silent one for minutes)
        found = auto_address()
        parts = _address_parts(found) if found else None
        if found and parts is None:  # Ray's words were "Invalid address format: X", naming no source
            raise InvalidParams(f"--ray-address auto found {found!r} in RAY_ADDRESS (or Ray's temp directory), which "
                                "is not a cluster's HOST:PORT or ray://HOST:PORT; set RAY_ADDRESS to the head's GCS "
                                "address, or name the cluster with --ray-address HOST:PORT",
                                data={"reason": "bad_ray_address", "address": found})
        shown = f"{found} (what --ray-address auto found in RAY_ADDRESS or Ray's temp directory)"
    if not parts:
        return
    host, port = parts
    if shown.strip().startswith("ray://"):  # Ray Client: the head's client server, not its GCS
        check = ("check --ray-address (the head's Ray Client server, e.g. ray://HOST:10001) and that the cluster "
                 "runs")
    else:
        check = "check --ray-address (the head's GCS address, e.g. HOST:6379) and that the cluster runs"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            conn.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:  # the first frame's header: length (3), type (1), flags, stream id
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except TimeoutError:
        raise Timeout(f"the Ray cluster at {shown} did not answer within {timeout_s:g} s; {check}",
                      data={"reason": "ray_unreachable", "address": address}) from None
    except OSError as exc:
        raise NotFound(f"the Ray cluster at {shown} cannot be reached ({exc.strerror or exc}); {check}",
                       data={"reason": "ray_unreachable", "address": address}) from None
    if len(head) < 9 or head[3] != _H2_SETTINGS:
        raise NotFound(f"{shown} is not a Ray cluster (what answers there does not speak gRPC); {check}",
                       data={"reason": "not_a_ray_cluster", "address": address})


def auto_address() -> str | None:
    """The address ``ray.init(address="auto")`` would join: ``RAY_ADDRESS`` if set, else the
    cluster Ray's temp directory names (or a running one it finds); None when there is none (Ray
    then says so itself, at once). Ray's own resolution, so the probe and the join agree."""
    import importlib

    from castor.messages.errors import InvalidParams

    services = importlib.import_module("ray._private.services")  # Ray's resolver: no public name for it
    try:
        found = services.get_ray_address_from_environment("auto", None)
    except ConnectionError:
        return None
    except ValueError as exc:  # an HTTP address in RAY_ADDRESS (the dashboard's, the jobs API's)
        raise InvalidParams(f"--ray-address auto: {' '.join(str(exc).split())}",
                            data={"reason": "bad_ray_address"}) from None
    return str(found) if found else None


def materia_component_for(backend: Any) -> Any:
    from castor.composition import materia_component

    if backend is None:
        return materia_component()
    from castor.scaleout.ray_backend import ray_materia_component

    return ray_materia_component(backend)


def scaleout_components(backend: Any) -> Any:
    """The runtime's session components for ``backend`` (None: the composition's defaults)."""
    from castor.composition import default_components, icarus_component

    if backend is None:
        return default_components()

    return [materia_component_for(backend), icarus_component()]
