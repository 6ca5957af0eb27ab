"""A real multi-node Ray cluster on loopback, owned by one test and torn down by process id.

Each node is ``ray start --block`` in its own session, so that stopping the cluster ends exactly
the processes this test started: the ``ray start`` parent stops the GCS/raylet it launched,
then every leftover process whose command line names this cluster's private temp dir is ended
by pid. ``ray stop`` is deliberately not used: it ends every Ray process on the machine,
including other people's clusters. Ports are reserved, not just found free (:class:`PortPool`):
CI runs two sets' Ray tests side by side, and once (stop 49) a job's runtime env got a 404 for its
package: the likely story is that a port free when asked went to the other cluster before this one
bound it, so the other cluster's runtime-env agent, which had never been sent the package, answered.
The dashboard (and with it Ray's job API) is off to keep memory small, unless a test asks for it
with ``dashboard=True``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MiB


PORTS = range(20000, 32768)
"""Where a cluster's fixed ports come from: above Ray's worker ports (10002-19999, which each raylet
checks itself) and below Linux's ephemeral range (32768-60999), so that no outgoing connection of any
process takes one between its choice and Ray's bind."""
PORT_LOCKS = Path(tempfile.gettempdir()) / "vc-ray-ports"


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class PortPool:
    """Ports held for one cluster across processes: each by an exclusive ``flock`` on its own file in
    ``PORT_LOCKS`` until :meth:`release` (or this process's end). The files stay: removing a lock file
    that another process has just opened would let two holders in."""

    held: dict[int, int] = field(default_factory=dict)
    """port -> the descriptor holding its lock."""

    def take(self) -> int:
        PORT_LOCKS.mkdir(exist_ok=True)
        for _ in range(1000):
            port = random.choice(PORTS)
            if port in self.held:
                continue
            fd = os.open(PORT_LOCKS / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if _bindable(port):  # also free of processes that take no lock
                self.held[port] = fd
                return port
            os.close(fd)
        raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1} after 1000 tries ({PORT_LOCKS})")

    def release(self) -> None:
        for fd in self.held.values():
            os.close(fd)
        self.held.clear()


def _ray_cli() -> list[str]:
    # The .venv's interpreter (not /work/venv/bin/ray): workers then run with the same Python,
    # which can import verl_consistency (the setup hook) as the image's Python can.
    return [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]


@dataclass
class NodeSpec:
    name: str
    num_cpus: int
    resources: dict[str, float] = field(default_factory=dict)


@dataclass
class LoopbackCluster:
    head_cpus: int
    workers: list[NodeSpec]
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rvc", dir="/tmp")))
    gcs_port: int = 0
    # The head's custom resources, as its pod declares them (an NPU run's head: {"NPU": 0}).
    head_resources: dict[str, float] = field(default_factory=dict)
    # The dashboard with its job API on 127.0.0.1:dashboard_port (0 until started).
    dashboard: bool = False
    dashboard_port: int = 0
    # Extra environment of the head node's processes (Ray's job driver inherits it).
    head_env: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ports: PortPool = field(default_factory=PortPool)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        """host:port of the job API, as KubeRay's RayJob status.dashboardURL has it."""
        return f"127.0.0.1:{self.dashboard_port}"

    def _start(self, args: list[str], log_name: str, extra_env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0", **(extra_env or {})}
        log = open(self.temp_dir / f"{log_name}.log", "wb")  # noqa: SIM115 - lives as long as the node
        per_node_ports = [
            "--node-manager-port",
            "--object-manager-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        ]
        ports = [x for flag in per_node_ports for x in (flag, str(self.ports.take()))]
        cmd = [
            *_ray_cli(),
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            "--disable-usage-stats",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            *ports,
            *args,
        ]
        self.procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        )

    def _start_head(self) -> None:
        self.gcs_port = self.ports.take()
        if self.dashboard:
            self.dashboard_port = self.ports.take()
            dashboard = [
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
            ]
        else:
            dashboard = ["--include-dashboard=false"]
        self._start(
            [
                "--head",
                f"--port={self.gcs_port}",
                f"--num-cpus={self.head_cpus}",
                *([f"--resources={json.dumps(self.head_resources)}"] if self.head_resources else []),
                *dashboard,
                f"--ray-client-server-port={self.ports.take()}",
                f"--temp-dir={self.temp_dir}",
                "--node-name=head",
            ],
            "head",
            self.head_env,
        )

    def start(self, timeout: float = 120) -> LoopbackCluster:
        # Ray gives its dashboard ~20 s to come up (services.start_api_server polls 200 x 0.1 s),
        # which a busy 2-core host can miss: then the head exits, and a fresh try usually works.
        attempts = 3 if self.dashboard else 1
        for attempt in range(attempts):
            self._start_head()
            try:
                self._wait_started("head", timeout)
                break
            except RuntimeError:
                head_log = (self.temp_dir / "head.log").read_text(errors="replace")
                if attempt == attempts - 1 or "Failed to start the dashboard" not in head_log:
                    raise
                self.stop()
                self.procs.clear()
        # One at a time: nodes on one host share the session dir, and two raylets starting
        # together pick the same socket names.
        for node in self.workers:
            self._start(
                [
                    f"--address={self.address}",
                    f"--num-cpus={node.num_cpus}",
                    f"--resources={json.dumps(node.resources)}",
                    f"--node-name={node.name}",
                ],
                node.name,
            )
            self._wait_started(node.name, timeout)
        self._wait_nodes(1 + len(self.workers), timeout)
        return self

    def _wait_started(self, log_name: str, timeout: float) -> None:
        """`ray start` prints this once its node has registered with the GCS."""
        log = self.temp_dir / f"{log_name}.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "Ray runtime started" in log.read_text(errors="replace"):
                return
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a ray node exited early: {self.logs()}")
            time.sleep(0.5)
        raise TimeoutError(f"ray node {log_name} did not start in {timeout}s: {self.logs()}")

    def _wait_nodes(self, count: int, timeout: float) -> None:
        """Poll the GCS from a throw-away process until ``count`` nodes are alive."""
        probe = (
            "import ray,sys;ray.init(address=sys.argv[1],_node_ip_address='127.0.0.1',logging_level='ERROR');"
            "print(sum(n['Alive'] for n in ray.nodes()))"
        )
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a ray node exited early; logs in {self.temp_dir}: {self.logs()}")
            res = subprocess.run(
                [sys.executable, "-c", probe, self.address], capture_output=True, text=True, timeout=30
            )
            last = res.stdout.strip() + res.stderr[-500:]
            if res.returncode == 0 and res.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            time.sleep(1)
        raise TimeoutError(f"{count} ray nodes not alive after {timeout}s: {last}\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted(self.temp_dir.glob("*.log"))
        )

    def own_pids(self) -> list[int]:
        """Every live process that belongs to this cluster: our Popen children, or names our temp dir."""
        mine = {p.pid for p in self.procs}
        marker = str(self.temp_dir)
        pids = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(proc.info["cmdline"] or [])
                if proc.info["pid"] in mine or marker in cmd:
                    pids.append(proc.info["pid"])
                    pids.extend(c.pid for c in proc.children(recursive=True))
        return sorted(set(pids) - {os.getpid()})

    def stop(self, grace: float = 15) -> list[int]:
        """Stop this cluster only. Returns the pids still alive afterwards (should be none)."""
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)  # the session we started: ray start and its children
        deadline = time.monotonic() + grace
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        leftovers = self.own_pids()
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        time.sleep(0.5)
        left = self.own_pids()
        if not left:
            self.ports.release()
        return left
