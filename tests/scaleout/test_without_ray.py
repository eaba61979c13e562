"""Without ``--backend ray`` castor never imports Ray; with it and no Ray, one clear error."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from .netns import REPO

pytestmark = pytest.mark.timeout(120)


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=100,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def _castor(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``castor`` with ``argv`` (its ``main``) in a fresh interpreter that has not imported Ray."""
    return _python(f"import sys\nfrom castor.cli import main\nsys.exit(main({argv!r}))\n", cwd)


def test_a_local_cast_and_every_help_never_import_ray(tmp_path: Path) -> None:
    (tmp_path / "answers.json").write_text(json.dumps(["hello"]))
    code = (
        "import sys\n"
        "from castor.cli import main, build_parser\n"
        "for cmd in ('serve', 'cast', 'soak'):\n"
        "    try:\n"
        "        build_parser().parse_args([cmd, '--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "rc = main(['cast', 'hi', '--loadout', 'hello', '--agent', 'script:answers.json', '--quiet'])\n"
        "print('RC', rc, 'RAY', any(m == 'ray' or m.startswith('ray.') for m in sys.modules))\n"
    )
    proc = _python(code, tmp_path)
    assert "RC 0 RAY False" in proc.stdout, proc.stdout + proc.stderr


def test_backend_ray_without_ray_is_one_line_and_exit_2(tmp_path: Path) -> None:
    code = ("import sys\nsys.modules['ray'] = None  # as if the extra were not installed\n"
            "from castor.cli import main\n"
            "sys.exit(main(['cast', 'hi', '--agent', 'script:a.json', '--backend', 'ray']))\n")
    proc = _python(code, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "castor[ray]" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_ray_client_address_without_ray_clients_package_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """``ray://`` needs Ray Client's gRPC package; a Ray installed without it (``pip install ray``
    rather than the extra) got as far as Ray's connect and failed there as ``invalid_params`` with
    Ray's own words. Now a usage error before anything starts, naming what to install."""
    code = ("import sys\nsys.modules['grpc'] = None  # Ray without its client extra\n"
            "from castor.cli import main\n"
            "sys.exit(main(['cast', 'hi', '--agent', 'script:a.json', '--backend', 'ray',"
            " '--ray-address', 'ray://127.0.0.1:10001']))\n")
    proc = _python(code, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "castor[ray]" in proc.stderr and "ray://" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_ray_address_without_backend_ray_is_refused(tmp_path: Path) -> None:
    proc = _castor(['cast', 'hi', '--agent', 'script:a.json', '--ray-address', '127.0.0.1:6379'], tmp_path)
    assert proc.returncode == 2 and "--ray-address and --ray-hosts need --backend ray" in proc.stderr, proc.stderr


def _port_nobody_listens_at() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_ray_address_nobody_answers_at_is_one_line_in_seconds_not_a_hang(tmp_path: Path) -> None:
    """Ray's own connect retried for minutes on an address nobody listens at (castor printed
    nothing; killed at 560 s); a malformed address is a usage error."""
    import time

    pytest.importorskip("ray")
    (tmp_path / "a.json").write_text(json.dumps(["hi"]))
    port = _port_nobody_listens_at()
    started = time.monotonic()
    proc = _castor(['cast', 'hi', '--agent', 'script:a.json', '--quiet', '--backend', 'ray',
                    '--ray-address', f'127.0.0.1:{port}'], tmp_path)
    assert time.monotonic() - started < 60
    assert proc.returncode == 1 and "castor: not_found: the Ray cluster at 127.0.0.1:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    bad = _castor(['cast', 'hi', '--agent', 'script:a.json', '--backend', 'ray', '--ray-address', 'notanaddress'],
                  tmp_path)
    assert bad.returncode == 2 and "--ray-address must be" in bad.stderr, bad.stderr


def test_a_command_after_a_node_death_is_a_kind_of_task_no_earlier_command_was() -> None:
    """Ray leases one task kind at a time and a lease request sent to a node that then stopped is
    never answered: commands submitted after a death must be a new kind (see fresh_kind)."""
    from castor.scaleout.utility_tasks import fresh_kind

    kinds = [fresh_kind(1.0, deaths) for deaths in range(5)]
    assert kinds == [1.0, 0.9999, 0.9998, 0.9997, 0.9996] and len(set(kinds)) == 5
    assert all(2 * kind > 1 for kind in kinds)  # two commands still never share one CPU
    assert fresh_kind(2.0, 150) == 1.995 and fresh_kind(0.01, 3) == 0.01


@contextlib.contextmanager
def _a_silent_listener() -> Iterator[int]:
    """A port on 127.0.0.1 where the kernel completes every handshake and nobody ever reads or
    writes: a wrong address that accepts but is no Ray cluster. Yields the port."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        yield silent.getsockname()[1]


def test_a_ray_address_that_accepts_but_never_speaks_is_one_line_in_seconds_not_a_hang(tmp_path: Path) -> None:
    """A wrong port that accepts connections but is not a Ray cluster (a silent service, here a
    listener that never writes) passed the reachability check, and Ray's connect then waited on it
    for ever (castor killed at 300 s, nothing printed). A GCS answers an HTTP/2 preface at once."""
    import time

    pytest.importorskip("ray")
    (tmp_path / "a.json").write_text(json.dumps(["hi"]))
    with _a_silent_listener() as port:
        started = time.monotonic()
        proc = _castor(['cast', 'hi', '--agent', 'script:a.json', '--quiet', '--backend', 'ray',
                        '--ray-address', f'127.0.0.1:{port}'], tmp_path)
    assert time.monotonic() - started < 60
    assert proc.returncode == 1 and f"castor: timeout: the Ray cluster at 127.0.0.1:{port}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_ray_address_auto_naming_a_silent_cluster_is_one_line_in_seconds_not_a_hang(tmp_path: Path) -> None:
    """``--ray-address auto`` joins what ``RAY_ADDRESS`` (or Ray's temp directory) names, and the
    reachability check skipped it: a stale or wrong one there made castor wait on Ray's connect
    (still waiting at 40 s, nothing but Ray's log lines). The address ``auto`` finds is now probed
    like an explicit one, and the error says where it came from."""
    import os
    import time

    pytest.importorskip("ray")
    (tmp_path / "a.json").write_text(json.dumps(["hi"]))
    with _a_silent_listener() as port:
        code = ("import sys\nfrom castor.cli import main\nsys.exit(main(['cast', 'hi', '--agent', 'script:a.json', "
                "'--quiet', '--backend', 'ray', '--ray-address', 'auto']))\n")
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=100,
                              env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                   "RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_USAGE_STATS_ENABLED": "0"})
        took = time.monotonic() - started
    assert took < 30, took
    assert proc.returncode == 1 and f"castor: timeout: the Ray cluster at 127.0.0.1:{port} (what --ray-address auto " \
        "found" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_port_that_answers_but_is_not_a_ray_cluster_is_one_line(tmp_path: Path) -> None:
    """An HTTP/1 server (the dashboard's port, a web service) at --ray-address is told apart from a GCS."""
    import http.server
    import threading

    pytest.importorskip("ray")
    (tmp_path / "a.json").write_text(json.dumps(["hi"]))
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        proc = _castor(['cast', 'hi', '--agent', 'script:a.json', '--quiet', '--backend', 'ray',
                        '--ray-address', f'127.0.0.1:{port}'], tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 1 and f"castor: not_found: 127.0.0.1:{port} is not a Ray cluster" in proc.stderr, \
        proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_cluster_that_refuses_this_process_is_a_typed_error_not_storage_unavailable(monkeypatch) -> None:
    """ray.init's ConnectionError (a cluster with token authentication and no token here: Ray
    enables it only for a cluster it finds itself, never for an explicit address) surfaced as
    ``storage_unavailable: Failed to connect to Ray cluster`` (an OSError to the CLI)."""
    ray = pytest.importorskip("ray")
    from castor.messages.errors import NotFound
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings

    def refused(**_kwargs: object) -> None:
        raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:6379")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refused)
    with pytest.raises(NotFound) as caught:
        RayBackend(RayBackendSettings(address="127.0.0.1:6379"))
    assert caught.value.data["reason"] == "ray_connect_failed"
    assert "RAY_AUTH_MODE=token" in caught.value.message


def test_a_cast_host_that_does_not_start_in_time_is_a_timeout_not_storage_unavailable(monkeypatch) -> None:
    """Ray's GetTimeoutError is a TimeoutError, so an OSError: a cast host that did not start within
    its bound (a cluster under heavy load, seen with every CPU busy) read ``storage_unavailable: Get
    timed out: some object(s) not ready``. Now ``timeout`` naming the host and why."""
    ray = pytest.importorskip("ray")
    import ray.exceptions as rex

    from castor.messages.errors import Timeout

    def slow(*_args: object, **_kwargs: object) -> None:
        raise rex.GetTimeoutError("Get timed out: some object(s) not ready.")

    killed: list[object] = []
    backend, ref = _backend_with_one_host(slow, killed)  # the method alone: no cluster needed to show the mapping
    with pytest.raises(Timeout) as caught:
        backend._await_host(ref, timeout_s=60)
    assert caught.value.data["host_id"] == "host-1" and caught.value.data["reason"] == "host_start_timeout"
    assert "did not start within 60s" in caught.value.message and caught.value.may_have_started is False
    # A host that starts after its deadline was left listed alive, drained by nobody: `castor inspect
    # hosts` showed it "yes" with no casts, replacements counted it on its node, and once its silence
    # fence ended it, "not answering: ActorDiedError" for ever. It is now not alive, and ended.
    assert backend.live_hosts() == [] and killed == [ref.actor]
    assert ray is not None


def test_a_soak_on_a_ray_address_nobody_answers_at_is_one_line_in_seconds_not_a_hang(tmp_path: Path) -> None:
    """``castor soak --backend ray --ray-address`` went straight to Ray's connect, without the
    check ``castor cast`` and ``castor serve`` make: minutes of retries on a wrong address."""
    import time

    pytest.importorskip("ray")
    port = _port_nobody_listens_at()
    started = time.monotonic()
    proc = _castor(['soak', '--backend', 'ray', '--ray-address', f'127.0.0.1:{port}', '--sessions', '1',
                    '--casts', '1', '--no-icarus', '--workdir', str(tmp_path / 'soak')], tmp_path)
    assert time.monotonic() - started < 60
    assert proc.returncode == 1 and f"castor: not_found: the Ray cluster at 127.0.0.1:{port}" in proc.stderr, \
        proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_a_lost_host_is_replaced_on_the_node_left_without_one() -> None:
    """Hosts start one per node, but a lost host's replacement always started on the first node
    Ray listed: a host killed on node B came back on node A, which had one already (A then ran
    two hosts, B none). It now starts on the live node with the fewest hosts (its own last among
    equals: it may be dying), and on the next one if that start fails."""
    pytest.importorskip("ray")
    import threading

    from castor.scaleout.ray_backend import HostRef, RayBackend, RayBackendSettings

    def backend_with(nodes: list[tuple[str, bool]], hosts: list[HostRef]) -> tuple[RayBackend, list[str | None]]:
        backend = RayBackend.__new__(RayBackend)  # the recovery alone: no cluster needed to show the placement
        backend._ray = SimpleNamespace(nodes=lambda: [{"NodeID": n, "Alive": alive} for n, alive in nodes])
        backend.settings = RayBackendSettings()
        backend._lock = threading.RLock()
        backend._closed = threading.Event()
        backend.hosts = {h.host_id: h for h in hosts}
        backend.recoveries = []
        backend.log = SimpleNamespace(warning=lambda *a, **k: None, error=lambda *a, **k: None)
        started: list[str | None] = []

        def start_host(node_id: str | None) -> HostRef:
            started.append(node_id)
            raise RuntimeError("no cluster here")  # as a dying node: the next best is tried, then no replacement

        backend._start_host = start_host  # type: ignore[method-assign]
        return backend, started

    lost = HostRef("host-2", None, node_id="B", alive=False)
    backend, started = backend_with([("A", True), ("B", True), ("C", True)],
                                    [HostRef("host-1", None, node_id="A"), lost, HostRef("host-3", None, node_id="C")])
    backend._recover(lost, [])
    assert started == ["B", "A"], started
    # its node gone too: the live node with the fewest hosts
    lost = HostRef("host-2", None, node_id="B", alive=False)
    backend, started = backend_with([("A", True), ("B", False), ("C", True)],
                                    [HostRef("host-1", None, node_id="A"), HostRef("host-4", None, node_id="A"), lost,
                                     HostRef("host-3", None, node_id="C")])
    backend._recover(lost, [])
    assert started == ["C", "A"], started


def test_a_ray_client_address_nobody_answers_at_points_at_the_client_port_not_the_gcs() -> None:
    """A ``ray://`` address that cannot be reached was told to check "the head's GCS address, e.g.
    HOST:6379", which is the other form: a Ray Client address names the client server (10001)."""
    from castor.messages.errors import NotFound
    from castor.scaleout.options import check_reachable

    port = _port_nobody_listens_at()
    with pytest.raises(NotFound) as caught:
        check_reachable(f"ray://127.0.0.1:{port}", timeout_s=5.0)
    assert "ray://HOST:10001" in caught.value.message and "6379" not in caught.value.message, caught.value.message
    with pytest.raises(NotFound) as caught:
        check_reachable(f"127.0.0.1:{port}", timeout_s=5.0)
    assert "HOST:6379" in caught.value.message, caught.value.message


def test_a_cpu_figure_finer_than_ray_counts_is_rounded_not_a_crashed_utility_slot(monkeypatch, tmp_path: Path) -> None:
    """``resources.cpus`` may be any figure above 0, but Ray refuses one finer than 0.0001 with a
    ValueError at submission: the utility slot crashed on it four times and the cast failed "work
    lost 4 times in a row: utility slot crashed" (``castor cast --backend ray``, ``cpus: 0.00001``),
    where the local backend ran it. The figure is now rounded to Ray's step (at least one step)."""
    ray = pytest.importorskip("ray")
    from castor.adapters.materia.process_runner import UtilityCommand
    from castor.scaleout import utility_tasks

    real = ray.remote(max_retries=0, num_returns="streaming")(utility_tasks._run_on_node)  # no cluster needed
    asked: list[float] = []

    class Task:
        def options(self, **kwargs: object) -> SimpleNamespace:
            real.options(**kwargs)  # Ray's own check of the figures
            asked.append(float(str(kwargs["num_cpus"])))
            return SimpleNamespace(remote=lambda cmd_map, lease_s, grant=None: object())

    monkeypatch.setattr(utility_tasks, "_task", lambda: Task())
    runner = utility_tasks.RayUtilityRunner()
    monkeypatch.setattr(runner._watch, "largest_cpus", lambda: None)
    monkeypatch.setattr(runner._watch, "dead_since", lambda: {})
    cmd = UtilityCommand(argv=["true"], cwd=tmp_path, timeout_ms=1000, max_output_bytes=1024)
    runner.spawn(cmd, {"cpus": 0.00001})
    runner.spawn(cmd, {"cpus": 1.00004})
    runner.spawn(cmd, {"cpus": 2.5})
    assert asked == [0.0001, 1.0, 2.5], asked


def test_an_installed_ray_of_another_minor_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path: Path) -> None:
    """castor[ray] pins Ray's minor (the backend uses Ray internals that change between minors), but
    a Ray installed on its own (``pip install -U ray``) went unchecked until something of it broke."""
    ray = pytest.importorskip("ray")
    from castor.cli import main

    monkeypatch.setattr(ray, "__version__", "2.61.0")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["cast", "build", "--agent", "script:a.json", "--backend", "ray"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "castor: invalid_params: " in err, err
    assert "needs Ray 2.60.x" in err and "found Ray 2.61.0" in err, err


def test_a_cluster_of_another_ray_version_is_a_typed_error_not_a_traceback(monkeypatch, capsys,
                                                                         tmp_path: Path) -> None:
    """Ray refuses a driver whose Ray or Python version is not the cluster's with a ``RuntimeError``
    over seven lines, which the CLI printed as a Python traceback (exit 1 with no castor line). Seen
    on a cluster started with ``ray start --head`` and a driver whose Ray said another patch version."""
    ray = pytest.importorskip("ray")
    from castor.cli import main
    from castor.messages.errors import Conflict
    from castor.scaleout import options

    def mismatched(**_kwargs: object) -> None:
        raise RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.60.0\n    Python: 3.11.7\n"
                           "This process on node 127.0.0.1 was started with:\n    Ray: 2.60.1\n    Python: 3.11.7\n")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", mismatched)
    monkeypatch.setattr(options, "check_reachable", lambda _address: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps(["hi"]))
    assert main(["cast", "build", "--agent", "script:a.json", "--backend", "ray",
                 "--ray-address", "127.0.0.1:6379"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("castor: conflict: cannot join the Ray cluster at 127.0.0.1:6379: the cluster runs Ray "
                          "2.60.0 on Python 3.11.7, this process Ray 2.60.1 on Python 3.11.7"), err
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings

    with pytest.raises(Conflict) as caught:
        RayBackend(RayBackendSettings(address="127.0.0.1:6379"))
    assert caught.value.data == {"reason": "ray_version_mismatch", "address": "127.0.0.1:6379"}


def test_a_session_with_no_live_cast_host_to_go_to_is_a_timeout_not_internal(monkeypatch) -> None:
    """Every host lost and none started again (the replacements' starts failed): a session opening
    waited, then failed ``internal`` ("no live cast host on the cluster"), which reads as a castor
    bug. Now ``timeout`` with reason ``no_live_cast_host``, saying where to look."""
    pytest.importorskip("ray")
    from castor.messages.errors import Timeout
    from castor.scaleout import ray_backend
    from castor.scaleout.ray_backend import HostRef, RayBackend, _Placed

    monkeypatch.setattr(ray_backend, "PLACE_TIMEOUT_S", 0.2, raising=False)  # the wait was 60 s, fixed
    backend = RayBackend.__new__(RayBackend)
    backend._lock = threading.RLock()
    backend._closed = threading.Event()
    backend.hosts = {"host-1": HostRef(host_id="host-1", actor=None, alive=False)}
    placed = _Placed(ctx=SimpleNamespace(info=SimpleNamespace(session_id="s1")))
    with pytest.raises(Timeout) as caught:
        backend._place(placed)
    assert caught.value.data["reason"] == "no_live_cast_host" and caught.value.data["session_id"] == "s1"
    assert caught.value.may_have_started is False and "castor inspect hosts" in caught.value.message


@pytest.mark.parametrize("address", ["http://127.0.0.1:6379", "127.0.0.1/x:6379", "user@10.0.0.5:6379",
                                     "ray://http://h:10001", "my host:6379"])
def test_a_ray_address_with_a_scheme_path_or_space_is_a_usage_error_not_unreachable(address: str) -> None:
    """docs/scale-out.md: a ``--ray-address`` that is not ``HOST:PORT``, ``auto`` or
    ``ray://HOST:PORT`` is a usage error (exit 2). ``http://127.0.0.1:6379`` (a URL, as the
    dashboard's address is written) passed the check and failed exit 1, "cannot be reached (Name or
    service not known)": the host was taken to be ``http://127.0.0.1``."""
    from castor.scaleout.options import backend_flag_problem

    problem = backend_flag_problem(SimpleNamespace(backend="ray", ray_address=address, ray_hosts=None))
    assert problem is not None and problem.startswith("--ray-address must be"), problem


@pytest.mark.parametrize("address", ["10.0.0.5:6379", "head.example-1.internal:6379", "[::1]:6379",
                                     "ray://[fe80::1%eth0]:10001", " 127.0.0.1:6379 ", "auto"])
def test_a_ray_address_of_a_host_name_or_address_passes_the_flag_check(address: str) -> None:
    pytest.importorskip("ray")
    from castor.scaleout.options import backend_flag_problem

    assert backend_flag_problem(SimpleNamespace(backend="ray", ray_address=address, ray_hosts=None)) is None


def test_soak_ray_hosts_chooses_the_soak_s_cast_hosts(monkeypatch, tmp_path: Path) -> None:
    """``castor soak --backend ray --ray-hosts N`` was accepted (the flag is on every command that
    runs casts) and ignored: the soak always started 2 cast hosts."""
    pytest.importorskip("ray")
    from castor.cli import main
    from castor.scaleout import options, ray_backend
    from castor.testing import soak, soak_on_ray

    seen: list[object] = []

    def soaked(settings: object, **_kwargs: object) -> None:
        seen.append(settings)
        raise SystemExit(0)  # the settings are all this test needs: no soak runs

    monkeypatch.setattr(soak, "run_soak", soaked)
    with pytest.raises(SystemExit):
        main(["soak", "--backend", "ray", "--ray-hosts", "3", "--ray-address", "127.0.0.1:6379",
              "--workdir", str(tmp_path / "soak")])
    assert [getattr(s, "ray_hosts", None) for s in seen] == [3]
    monkeypatch.setattr(options, "check_reachable", lambda _address: None)
    monkeypatch.setattr(ray_backend, "RayBackend", lambda settings: settings)
    assert soak_on_ray.start_cluster_backend("127.0.0.1:6379", 3)[1].hosts == 3
    assert soak_on_ray.start_cluster_backend("127.0.0.1:6379")[1].hosts == soak_on_ray.SOAK_HOSTS


def test_a_cast_host_on_a_node_running_another_castor_is_refused_by_name(monkeypatch) -> None:
    """docs/scale-out.md asks every node to run the serving process's castor version, and nothing
    checked it: a node with another castor ran a host that spoke another protocol to the serving
    process. A host that answers with another version is ended, and its start fails ``conflict``
    (reason ``castor_version_mismatch``) naming both versions and the node."""
    pytest.importorskip("ray")
    from castor.messages.errors import Conflict
    from castor.version import __version__

    killed: list[object] = []
    info = {"node_id": "ab" * 28, "pid": 42, "castor_version": "0.0.1-other"}
    backend, ref = _backend_with_one_host(lambda *_a, **_k: info, killed)
    with pytest.raises(Conflict) as caught:
        backend._await_host(ref, timeout_s=60)
    assert caught.value.data["reason"] == "castor_version_mismatch"
    assert f"runs castor 0.0.1-other, this process castor {__version__}" in caught.value.message
    assert backend.live_hosts() == [] and killed == [ref.actor] and ref.drainer is None


def test_the_cluster_s_error_messages_go_to_castor_s_log_not_stdout(capsys, monkeypatch) -> None:
    """Ray's driver prints the cluster's error messages (a node marked dead; "Raylet is terminated"
    and the last 20 lines of its log) on stdout whatever ``log_to_driver`` says: a raylet killed
    under ``castor cast --backend ray`` put 25 lines of Ray's log among the command's output (seen
    on a 2-node ``ray.cluster_utils.Cluster``). Here the function Ray's listener thread calls, as it
    calls it, once the backend is made (a refused connect: no cluster needed)."""
    ray = pytest.importorskip("ray")
    import importlib

    from castor.messages.errors import NotFound
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings

    worker = importlib.import_module("ray._private.worker")
    monkeypatch.setattr(worker, "print_to_stdstream", worker.print_to_stdstream)  # undone after the test

    def refused(**_kwargs: object) -> None:
        raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:6379")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refused)
    with pytest.raises(NotFound):
        RayBackend(RayBackendSettings(address="127.0.0.1:6379"))
    capsys.readouterr()
    from castor._log import logger

    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        dump = "\n".join(f"    [state-dump] line {n}" for n in range(20))
        worker.print_to_stdstream({"lines": ["Raylet is terminated. Termination is unexpected.\n" + dump],
                                   "pid": "raylet", "is_err": False}, ignore_prefix=False)
    finally:
        logger.remove(sink)
    assert capsys.readouterr().out == ""
    assert warnings == ["Ray (raylet): Raylet is terminated. Termination is unexpected. (+20 lines: see the node's "
                        "Ray logs)"], warnings


def test_stopping_the_backend_asks_every_host_at_once_and_ends_each(monkeypatch) -> None:
    """Stopping ``castor serve`` gave each live host 30 s in turn to stop, so three hosts on cut-off
    nodes held it 90 s; and a ``ray.kill`` that raised (a host gone with its node) left the hosts
    after it running. Now one deadline for all, and every host is killed."""
    pytest.importorskip("ray")
    from castor.scaleout import ray_backend
    from castor.scaleout.ray_backend import HostRef, RayBackend

    bound = getattr(ray_backend, "SHUTDOWN_TIMEOUT_S", 30.0)  # one host's 30 s, before: now all hosts'
    waited: list[float] = []
    killed: list[str] = []

    def get(_ref: object, timeout: float) -> None:  # a host that never answers: its node is cut off
        waited.append(timeout)
        raise TimeoutError

    def wait(refs: list[object], num_returns: int, timeout: float) -> tuple[list[object], list[object]]:
        waited.append(timeout)
        return [], refs

    def kill(actor: SimpleNamespace, no_restart: bool) -> None:
        killed.append(actor.name)
        if actor.name == "host-1":
            raise ValueError("actor handle of a dead actor")

    backend = RayBackend.__new__(RayBackend)
    backend._ray = SimpleNamespace(get=get, wait=wait, kill=kill)
    backend._closed = threading.Event()
    backend._io = SimpleNamespace(shutdown=lambda wait: None)
    backend.log = SimpleNamespace(info=lambda *_a, **_k: None)
    backend.hosts = {f"host-{n}": HostRef(host_id=f"host-{n}", actor=SimpleNamespace(
        name=f"host-{n}", shutdown=SimpleNamespace(remote=object))) for n in (1, 2, 3)}
    backend.shutdown()
    assert sum(waited) <= bound, waited
    assert killed == ["host-1", "host-2", "host-3"]


def test_a_host_method_that_raises_is_named_with_its_cause_not_only_ray_s_wrapper() -> None:
    """A host's method that raised reached the caller as ``internal: cluster error on host-1:
    RayTaskError(ValueError)``: neither the error's words nor, for a castor error raised there, its
    own code. Now a castor error keeps its code and data; anything else is ``internal`` with its
    type and words."""
    rex = pytest.importorskip("ray.exceptions")
    from castor.messages.errors import Conflict, Internal
    from castor.scaleout.ray_backend import HostRef, RayBackend

    def raising(cause: BaseException) -> Callable[..., None]:
        def get(*_args: object, **_kwargs: object) -> None:
            raise rex.RayTaskError("call", "Traceback ...", cause).as_instanceof_cause()
        return get

    backend = RayBackend.__new__(RayBackend)
    host = HostRef(host_id="host-1", actor=None)
    backend._ray = SimpleNamespace(get=raising(ValueError("bad\nvalue")))
    with pytest.raises(Internal) as caught:
        backend._get(host, object())
    assert caught.value.message == "cast host host-1 failed: ValueError: bad value", caught.value.message
    assert caught.value.may_have_started is True
    backend._ray = SimpleNamespace(get=raising(Conflict("cast c1 is held by another runtime", data={"cast_id": "c1"})))
    with pytest.raises(Conflict) as held:
        backend._get(host, object())
    assert held.value.data["cast_id"] == "c1"


@pytest.mark.parametrize("found", ["notanaddress", "http://127.0.0.1:8265"])
def test_ray_address_auto_finding_no_cluster_address_in_ray_address_says_so(found: str, monkeypatch, capsys,
                                                                           tmp_path: Path) -> None:
    """``--ray-address auto`` with ``RAY_ADDRESS=notanaddress`` read ``castor: invalid_params:
    Invalid address format: notanaddress`` (Ray's words, naming neither RAY_ADDRESS nor what to
    do), and an HTTP address Ray's own several-line advice, its line breaks shown as ``\\n``."""
    pytest.importorskip("ray")
    from castor.cli import main

    monkeypatch.setenv("RAY_ADDRESS", found)
    monkeypatch.chdir(tmp_path)
    assert main(["cast", "build", "--agent", "script:a.json", "--backend", "ray", "--ray-address", "auto"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("castor: invalid_params: --ray-address auto"), err
    assert "\\n" not in err and ("RAY_ADDRESS" in err), err


def test_a_cast_that_fails_on_the_cluster_says_which_flags_resume_it_there(monkeypatch, capsys,
                                                                           tmp_path: Path) -> None:
    """``castor cast --backend ray`` that failed said "`castor recast ID` resumes it": typed as
    shown, that recast ran the cast's commands on this machine, not on the cluster. Here the cast
    runs in this process (the backend stubbed out: no cluster) and fails."""
    pytest.importorskip("ray")
    from castor.cli import main
    from castor.scaleout import options

    monkeypatch.setattr(options, "make_backend", lambda _args: None)
    monkeypatch.setattr(options, "check_reachable", lambda _address: None)
    (tmp_path / ".pi").mkdir()
    (tmp_path / ".pi" / "pi-materia.json").write_text(json.dumps({"activeLoadout": "one", "loadouts": {"one": {
        "entry": "Socket-1", "sockets": {"Socket-1": {"type": "utility", "command": ["false"], "parse": "text"}}}}}))
    (tmp_path / "a.json").write_text(json.dumps(["hi"]))
    monkeypatch.chdir(tmp_path)
    assert main(["cast", "build", "--agent", "script:a.json", "--quiet", "--backend", "ray",
                 "--ray-address", "10.0.0.5:6379"]) == 1
    err = capsys.readouterr().err
    assert "resumes it" in err and "castor: to resume it on the cluster again, add --backend ray --ray-address " \
        "10.0.0.5:6379 to that command (without them it runs on this machine)" in err, err


def _backend_with_one_host(get, killed: list[object]):
    """A ``RayBackend`` with no cluster behind it: ``get`` stands for ``ray.get``, a kill is recorded
    in ``killed``, and one host, ``host-1``, is listed (its ``HostRef`` returned beside it)."""
    from castor.scaleout.ray_backend import HostRef, RayBackend

    backend = RayBackend.__new__(RayBackend)
    backend._ray = SimpleNamespace(get=get, kill=lambda actor, no_restart: killed.append(actor))
    backend._lock = threading.RLock()
    ref = HostRef(host_id="host-1", actor=SimpleNamespace(ping=SimpleNamespace(remote=lambda: object())))
    backend.hosts = {"host-1": ref}
    return backend, ref


class _FakeHost:
    """A cast host's actor handle without a cluster: each ``.remote`` call is recorded (with the
    seconds since ``t0``) and returns its answer at once."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.calls: list[tuple[float, str, object]] = []
        for method, answer in (("open_session", {"session_id": "s1"}), ("close_session", True),
                               ("call", {"ok": {"casts": []}})):
            setattr(self, method, SimpleNamespace(remote=self._recorder(method, answer)))

    def _recorder(self, method: str, answer: object) -> Callable[..., object]:
        def remote(*args: object) -> object:
            self.calls.append((time.monotonic() - self.t0, method, args[0]))
            return answer
        return remote


def _backend_with_no_live_host(get: Callable[..., object]):
    from castor.scaleout import ray_backend
    from castor.scaleout.ray_backend import HostRef, RayBackend

    backend = RayBackend.__new__(RayBackend)
    backend._lock = threading.RLock()
    backend._closed = threading.Event()
    backend.log = ray_backend.logger
    backend._ray = SimpleNamespace(get=get)
    backend.hosts = {"host-1": HostRef(host_id="host-1", actor=None, alive=False)}
    backend._placed = {}
    return backend


def test_a_session_opening_waits_for_a_cast_host_no_longer_than_its_own_deadline(tmp_path: Path) -> None:
    """A session opening with no live cast host waited up to 60 s for one, past the 10 s its
    caller waits: the caller got ``timeout`` while the placement went on behind it. Now the
    opening answers within its deadline; the session is placed by its next call, within that
    call's own deadline, once a host is up."""
    pytest.importorskip("ray")
    from castor.actors.materia.api import materia_call
    from castor.ports.session_component import HarnessLink, RuntimeSettings, SessionInfo
    from castor.runtime import Runtime
    from castor.scaleout.ray_backend import HostRef, ray_materia_component

    backend = _backend_with_no_live_host(lambda ref, timeout: ref)
    runtime = Runtime(RuntimeSettings(session_open_timeout_s=2.0), components=[ray_materia_component(backend)])
    host = _FakeHost(time.monotonic())
    try:
        runtime.open_session(SessionInfo(session_id="s1", cwd=str(tmp_path), trusted=True),
                             HarnessLink(agent=None, session_log=None, ui=None))
        opened = time.monotonic() - host.t0
        assert opened <= 2.0, opened  # it was the runtime's timeout after 2 s: the placement went on
        backend.hosts["host-2"] = HostRef(host_id="host-2", actor=host, drainer=threading.current_thread())
        assert materia_call(runtime, "s1", "list", {}, timeout=5.0) == {"casts": []}
        assert [(method, arg) for _t, method, arg in host.calls][:2] == [
            ("open_session", {"session_id": "s1", "cwd": str(tmp_path), "trusted": True, "flags": {},
                              "session_file": None}), ("call", "s1")]
        assert backend.hosts["host-2"].sessions == {"s1"}
    finally:
        runtime.shutdown(5)
    assert ("close_session", "s1") in [(method, arg) for _t, method, arg in host.calls]


def test_a_host_that_answers_a_session_opening_too_late_is_told_to_close_it() -> None:
    """A host that opens the session after its opening gave up would keep a session nobody holds:
    it is told to close it again, and the session is on no host."""
    rex = pytest.importorskip("ray.exceptions")
    from castor.scaleout.ray_backend import HostRef, _Placed

    def late(_ref: object, timeout: float) -> object:
        assert timeout <= 1.0, timeout  # bounded by the opening's deadline (it was 30 s)
        raise rex.GetTimeoutError("late")

    backend = _backend_with_no_live_host(late)
    host = _FakeHost(time.monotonic())
    backend.hosts["host-2"] = HostRef(host_id="host-2", actor=host, drainer=threading.current_thread())
    ctx = SimpleNamespace(info=SimpleNamespace(session_id="s1", model_dump=dict),
                          harness=SimpleNamespace(host_context=None, agent=None, kind="endpoint"))
    assert backend.open_session(ctx, timeout_s=1.0) is None
    assert [method for _t, method, _a in host.calls] == ["open_session", "close_session"]
    assert backend.hosts["host-2"].sessions == set()
    placed: _Placed = backend._placed["s1"]
    assert placed.host_id is None and placed.failure is not None and placed.failure.code == "timeout"


def test_a_host_that_does_not_answer_its_drains_is_taken_for_lost_revoked_and_killed(monkeypatch) -> None:
    """A host whose process is stopped (SIGSTOP, a frozen VM) answers nothing, and the cluster
    sees nothing wrong: it was drained for ever, every call for its sessions timed out and its
    casts never moved. Now, unanswered for ``lost_after_silence_s``, it is taken for lost: its
    grant revoked first (its commands end, it ends itself if it runs again), then killed (best
    effort), and its sessions move."""
    rex = pytest.importorskip("ray.exceptions")
    from castor.scaleout import ray_backend
    from castor.scaleout.ray_backend import RayBackendSettings

    def silent(_ref: object, timeout: float) -> object:
        time.sleep(min(timeout, 0.05))
        raise rex.GetTimeoutError("silent")

    killed: list[object] = []
    backend, ref = _backend_with_one_host(silent, killed)
    backend.settings = RayBackendSettings(lost_after_silence_s=0.5)
    backend._closed = threading.Event()
    backend.log = ray_backend.logger
    ref.grant = "host-1-abc"
    ref.actor = SimpleNamespace(drain=SimpleNamespace(remote=lambda *a: object()))
    order: list[str] = []
    monkeypatch.setattr(ray_backend.RayBackend, "_revoke", lambda self, host: order.append(f"revoke {host.grant}"))
    monkeypatch.setattr(ray_backend.RayBackend, "_recover",
                        lambda self, host, sessions: order.append(f"recover {host.host_id}"))
    monkeypatch.setattr(ray_backend, "start_thread", lambda target, args, **_kw: target(*args))
    began = time.monotonic()
    backend._drain(ref)  # returns once the host is lost
    assert 0.5 <= time.monotonic() - began < 5.0
    assert ref.alive is False and ref.lost_at is not None and killed == [ref.actor]
    assert order == ["revoke host-1-abc", "recover host-1"], order


def test_closing_a_session_whose_host_is_cut_off_ends_it_here_within_seconds() -> None:
    """Closing a session whose host does not answer (its node cut off, not yet declared dead)
    blocked its caller 30 s. Now the session is forgotten at once and its host is waited for
    ``SESSION_CLOSE_WAIT_S`` at most (its own close there is best effort)."""
    rex = pytest.importorskip("ray.exceptions")
    from castor.scaleout import ray_backend
    from castor.scaleout.ray_backend import HostRef, _Placed

    never = threading.Event()

    def silent(_ref: object, timeout: float) -> object:  # a host that never answers
        never.wait(timeout)
        raise rex.GetTimeoutError("silent")

    backend = _backend_with_no_live_host(silent)
    host = _FakeHost(time.monotonic())
    backend.hosts["host-2"] = HostRef(host_id="host-2", actor=host, drainer=threading.current_thread(),
                                      sessions={"s1"})
    backend._placed["s1"] = _Placed(ctx=None, host_id="host-2")
    bound = getattr(ray_backend, "SESSION_CLOSE_WAIT_S", 5.0)
    assert bound <= 5.0
    backend.close_session("s1")
    assert time.monotonic() - host.t0 <= bound + 1.0, time.monotonic() - host.t0  # it was 30 s
    assert [method for _t, method, _a in host.calls] == ["close_session"]
    assert backend._placed == {} and backend.hosts["host-2"].sessions == set()


def test_castor_status_and_casts_name_the_backend_flags_a_cast_last_ran_with(monkeypatch, capsys,
                                                                            tmp_path: Path) -> None:
    """``castor status ID`` of a cast that failed under ``castor cast --backend ray`` said "↻ RECAST
    TARGET: castor recast ID": typed as shown, the recast ran on this machine. The cast's cli.json
    now records the backend flags of the command that last ran it (no token: Ray reads that from
    its environment), and ``castor status`` / ``castor casts`` name them; a recast on this machine
    clears them. The cluster is stubbed out (the casts run in this process)."""
    pytest.importorskip("ray")
    from castor.cli import main
    from castor.scaleout import options

    monkeypatch.setattr(options, "make_backend", lambda _args: None)
    monkeypatch.setattr(options, "check_reachable", lambda _address: None)
    (tmp_path / ".pi").mkdir()
    (tmp_path / ".pi" / "pi-materia.json").write_text(json.dumps({"activeLoadout": "one", "loadouts": {"one": {
        "entry": "Socket-1", "sockets": {"Socket-1": {"type": "utility", "command": ["false"], "parse": "text"}}}}}))
    (tmp_path / "a.json").write_text(json.dumps(["hi"]))
    monkeypatch.chdir(tmp_path)
    flags = "--backend ray --ray-address 10.0.0.5:6379 --ray-hosts 2"
    assert main(["cast", "build", "--agent", "script:a.json", "--quiet", *flags.split()]) == 1
    cast_id = next((tmp_path / ".pi" / "pi-materia").glob("*/state.json")).parent.name
    capsys.readouterr()
    assert main(["status", cast_id]) == 0
    assert f"↻ RECAST TARGET: castor recast {cast_id} {flags}\n" in capsys.readouterr().out
    assert main(["casts"]) == 0
    assert f"recast: castor recast {cast_id} {flags}\n" in capsys.readouterr().out
    assert main(["casts", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["backend_flags"] == flags.split()
    assert main(["recast", cast_id, "--agent", "script:a.json", "--quiet"]) == 1  # on this machine now
    capsys.readouterr()
    assert main(["status", cast_id]) == 0
    out = capsys.readouterr().out
    assert f"↻ RECAST TARGET: castor recast {cast_id}\n" in out and "--backend" not in out, out


def test_what_ray_prints_as_it_starts_goes_to_castor_s_log_not_stderr(capfd, monkeypatch) -> None:
    """``castor cast --backend ray`` began with Ray's words on stderr: "Token authentication is
    enabled for this Ray cluster. ..." (a Python record Ray's start leaves with no handler, which
    Python's last resort printed) and a line of its C++ core (``[... W ...] network_util.cc:330:
    Failed to determine local IP ...``, on a machine that cannot reach 8.8.8.8). Here a stand-in for
    ``ray.init`` does what Ray's did, then refuses the connect (no cluster needed)."""
    ray = pytest.importorskip("ray")
    import logging
    import os

    from castor._log import logger
    from castor.logs import configure_logging
    from castor.messages.errors import NotFound
    from castor.scaleout.ray_backend import RayBackend, RayBackendSettings

    ray_logger = logging.getLogger("ray")
    monkeypatch.setattr(ray_logger, "handlers", list(ray_logger.handlers))  # undone after the test
    monkeypatch.setattr(ray_logger, "propagate", ray_logger.propagate)

    def init(**_kwargs: object) -> None:
        os.write(2, b"[2026-12-07 00:04:54,230 W 22663 22663] network_util.cc:330: Failed to determine local IP via "
                    b"external connectivity to: 8.8.8.8:53, falling back to hostname resolution\n")
        logger.warning("castor's own one-line warning")
        logging.getLogger("ray").handlers.clear()  # as ray.init(configure_logging=False) does
        logging.getLogger("ray._private.authentication.authentication_token_setup").warning(
            "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.")
        raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:6379")

    configure_logging("WARNING")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(NotFound):
        RayBackend(RayBackendSettings(address="127.0.0.1:6379"))
    captured = capfd.readouterr()
    assert "Token authentication" not in captured.err + captured.out, captured.err
    assert "network_util.cc" not in captured.err + captured.out, captured.err
    assert "castor's own one-line warning" in captured.err, captured.err


def test_closing_a_session_whose_host_is_cut_off_takes_seconds_and_strands_nothing(tmp_path: Path) -> None:
    """The whole close, as ``session.close`` runs it: the materia close hook asks the host to end
    the session (``session_end``), then the session's actors stop. With the host cut off, the hook's
    ask timed out after 5 s while the actor still waited on the host, the actor was killed for
    overrunning its stop 5 s later, and its release never ran: 10 s, and the session stayed placed
    on its host, held by nobody. Now ``session_end`` has ``SESSION_CLOSE_WAIT_S`` and the release
    runs in the close hook: under 7 s, and the host is told to close it."""
    rex = pytest.importorskip("ray.exceptions")
    from castor.ports.session_component import HarnessLink, SessionInfo
    from castor.runtime import Runtime
    from castor.scaleout.ray_backend import HostRef, ray_materia_component

    cut_off = threading.Event()
    never = threading.Event()

    def get(ref: object, timeout: float) -> object:
        if cut_off.is_set():
            never.wait(timeout)
            raise rex.GetTimeoutError("cut off")
        return ref

    backend = _backend_with_no_live_host(get)
    host = _FakeHost(time.monotonic())
    backend.hosts["host-2"] = HostRef(host_id="host-2", actor=host, drainer=threading.current_thread())
    runtime = Runtime(components=[ray_materia_component(backend)])
    try:
        runtime.open_session(SessionInfo(session_id="s1", cwd=str(tmp_path), trusted=True),
                             HarnessLink(agent=None, session_log=None, ui=None))
        assert backend.hosts["host-2"].sessions == {"s1"}
        cut_off.set()
        began = time.monotonic()
        runtime.close_session("s1")
        took = time.monotonic() - began
    finally:
        never.set()
        runtime.shutdown(5)
    assert took < 7.0, took  # it was 10 s
    assert backend._placed == {} and backend.hosts["host-2"].sessions == set()
    assert "close_session" in [method for _t, method, _a in host.calls]


def test_a_serving_process_drains_each_cast_host_as_soon_as_it_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hosts a serving process starts were awaited in turn: a host up at once waited undrained
    while the one before it started (up to 60 s on a busy cluster), and its silence fence, counted
    from its own start, ended it first (``castor serve --backend ray`` failed "cast host host-2
    could not start (ActorDiedError)", seen in the kill_host scenario under load). Each host is now
    drained as soon as it answers: here host-1 answers only once host-2 is drained."""
    ray = pytest.importorskip("ray")
    from castor.scaleout import ray_backend
    from castor.scaleout.ray_backend import HostRef, RayBackend, RayBackendSettings

    host2_drained = threading.Event()

    class Pinged:
        def __init__(self, host_id: str) -> None:
            self.host_id = host_id

    def actor(host_id: str) -> SimpleNamespace:
        def drain(*_args: object) -> object:
            if host_id == "host-2":
                host2_drained.set()
            return "drained"
        return SimpleNamespace(ping=SimpleNamespace(remote=lambda: Pinged(host_id)),
                               drain=SimpleNamespace(remote=drain))

    def get(ref: object, timeout: float | None = None) -> object:
        if isinstance(ref, Pinged):
            if ref.host_id == "host-1" and not host2_drained.wait(5):
                raise ray.exceptions.GetTimeoutError("host-1 answers once host-2 is drained")
            return {"node_id": f"node-{ref.host_id}", "pid": 1, "castor_version": ray_backend.__version__}
        time.sleep(0.05)
        return []

    def start_host(self: RayBackend, node_id: str | None) -> HostRef:
        with self._lock:
            self._counter += 1
            ref = HostRef(host_id=f"host-{self._counter}", actor=actor(f"host-{self._counter}"))
            self.hosts[ref.host_id] = ref
        return ref

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    nodes = [{"NodeID": "node-a", "Alive": True}, {"NodeID": "node-b", "Alive": True}]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "kill", lambda *_args, **_kwargs: None)
    monkeypatch.setattr(RayBackend, "_start_host", start_host)
    backend = RayBackend(RayBackendSettings(hosts=2))
    try:
        assert [h.host_id for h in backend.live_hosts()] == ["host-1", "host-2"]
        assert all(h.drainer is not None for h in backend.live_hosts())
    finally:
        backend._closed.set()


def test_a_starting_cast_host_waits_for_its_first_drain_as_long_as_the_serving_process_waits_for_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cast host's silence fence (45 s) was shorter than the time the serving process allows a
    host to start (60 s): a host whose answer came late was accepted, or still awaited, after its
    own fence had ended it undrained. A host now waits for its first drain as long as the serving
    process may take to accept it (its start allowance and a margin); once drained, the fence's
    own silence applies again. Small values stand for 45 and 60 s."""
    pytest.importorskip("ray")
    from castor.scaleout import host as host_module
    from castor.scaleout.ray_backend import FIRST_DRAIN_MARGIN_S, RayBackend, RayBackendSettings

    settings = RayBackendSettings(fence_after_s=0.2, host_start_timeout_s=1.0)
    # what the serving process gives each host it starts: its own start allowance, and the margin
    started: list[tuple[object, ...]] = []
    remote = SimpleNamespace(options=lambda **_options: SimpleNamespace(remote=lambda *args: started.append(args)))
    backend = RayBackend.__new__(RayBackend)
    backend.settings, backend._lock, backend._counter, backend.hosts = settings, threading.RLock(), 0, {}
    backend._host_runtime, backend._holder = {}, b"held"
    backend._ray = SimpleNamespace(remote=lambda _cls: remote)
    monkeypatch.setattr(RayBackend, "_hold_grant", lambda self, grant: None)
    backend._start_host(None)
    first_drain_within_s = started[0][5]
    assert first_drain_within_s == settings.first_drain_within_s == 1.0 + FIRST_DRAIN_MARGIN_S

    ended = threading.Event()
    monkeypatch.setattr(host_module.CastHost, "_end_unclaimed", lambda self: ended.set())
    began = time.monotonic()
    host = host_module.CastHost("host-1", {"utility_slots": 1}, 0.2, 1.0, None, 1.0)  # 1.0: a small allowance
    try:
        assert not ended.wait(0.8), "ended by its fence while the serving process may still accept it"
        assert ended.wait(5.0) and time.monotonic() - began >= 1.0  # undrained past the allowance: it ends
        ended.clear()
        drained = host_module.SilenceFence(0.2, ended.set, 1.0)
        drained.heard()  # its first drain: the fence's own silence from now on
        assert ended.wait(0.8), "a drained host waits only the fence's own silence"
    finally:
        host.shutdown()
