"""A Ray head on 127.0.0.1 with the job server, started and ended by PID (never `ray stop`).

Used by tests and by anyone who wants to try `ray job submit` on one machine. Every port is
chosen free up front and the head's session lives under its own ``temp_dir``, so it never
collides with, or ends, another Ray on the same machine.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def pids_naming(text: str) -> list[int]:
    """PIDs of processes whose command line contains ``text`` (a temp dir only we use):
    how a Ray cluster we started is found and ended, never by process name."""
    out = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True).stdout
    return [
        int(line.split()[0]) for line in out.splitlines()[1:] if text in line and int(line.split()[0]) != os.getpid()
    ]


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now. Every socket stays bound until all ``n`` are
    chosen, so the kernel cannot hand the same port out twice (asking one at a time, closing
    each before the next, can: two Ray components were once given one port that way)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def free_port() -> int:
    return free_ports(1)[0]


# Every port `ray start --head` opens on its own, by its flag: a head given all of them never
# meets another Ray on the machine (the worker ports, 10002-19999 by default, are outside the
# kernel's ephemeral range that free_ports draws from).
HEAD_PORT_FLAGS = (
    "port",
    "dashboard-port",
    "ray-client-server-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
    "node-manager-port",
    "object-manager-port",
)


def head_ports() -> dict[str, int]:
    """A distinct free port for each of HEAD_PORT_FLAGS."""
    return dict(zip(HEAD_PORT_FLAGS, free_ports(len(HEAD_PORT_FLAGS))))


class LocalRayHead:
    """``with LocalRayHead(num_cpus=2) as head: ... head.dashboard_url ...``"""

    def __init__(self, num_cpus: int = 2, env: dict | None = None) -> None:
        self.num_cpus = num_cpus
        self.temp_dir = tempfile.mkdtemp(prefix="hvray-", dir="/tmp")  # short: Ray's socket paths are length-limited
        self.ports = head_ports()
        self.dashboard_port = self.ports["dashboard-port"]
        self.env = dict(env or os.environ)
        self.env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Token authentication with a token of this head's own: clients get it from client_env().
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        self.proc: subprocess.Popen | None = None

    def client_env(self, base: dict | None = None) -> dict:
        """Environment for `ray job submit` / JobSubmissionClient against this head."""
        env = dict(base or os.environ)
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.env["RAY_AUTH_TOKEN"])
        return env

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self, timeout: float = 120) -> LocalRayHead:
        ray_cli = str(Path(sys.executable).with_name("ray"))
        cmd = [
            ray_cli,
            "start",
            "--head",
            "--block",
            f"--num-cpus={self.num_cpus}",
            "--node-ip-address=127.0.0.1",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            *(f"--{flag}={port}" for flag, port in self.ports.items()),
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
        ]
        self.log = open(Path(self.temp_dir) / "head.log", "w")
        self.proc = subprocess.Popen(
            cmd, env=self.env, start_new_session=True, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray head exited: {(Path(self.temp_dir) / 'head.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=2):
                    return self
            except urllib.error.HTTPError:
                return self  # answering (401 when Ray's token authentication is on): the job server is up
            except OSError:
                time.sleep(1)
        logs = (Path(self.temp_dir) / "head.log").read_text()[-2000:]
        dash = sorted(Path(self.temp_dir).glob("session_*/logs/dashboard.log"))
        if dash:
            logs += "\n--- dashboard.log ---\n" + dash[-1].read_text()[-3000:]
        self.stop()
        raise TimeoutError(f"ray head did not answer on {self.dashboard_url} within {timeout}s:\n{logs}")

    def pids(self) -> list[int]:
        """Processes of this head: the `ray start` group plus anything naming its temp dir."""
        return pids_naming(self.temp_dir)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        time.sleep(1)
        kill_pids(self.pids())
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalRayHead:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
