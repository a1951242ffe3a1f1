"""Benchmarks run the way a reader runs them: ``python benchmarks/<script>`` in a subprocess."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from infra.local_cluster import kill_pids, pids_naming

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


class Bench:
    """``bench(script, *args)``: the script's stdout, after asserting it exited 0.

    ``bench.tmp`` is a short folder of this test's own, also the run's ``TMPDIR`` (Ray puts its
    session folder there, and Ray's socket paths are length-limited, hence not pytest's
    ``tmp_path``). A run past ``timeout`` is killed with its whole process group; at the end of
    the test, so is any process still naming ``bench.tmp`` (a Ray cluster the run left behind)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    def __call__(self, script: str, *args: str, timeout: float = 300) -> str:
        exe = ["bash"] if script.endswith(".sh") else [sys.executable]
        proc = subprocess.Popen(
            [*exe, str(BENCHMARKS / script), *args],
            cwd=BENCHMARKS.parent,
            env={**os.environ, "TMPDIR": str(self.tmp)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"{script} ran past {timeout}s\n{out[-2000:]}\n{err[-3000:]}")
        assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{out[-2000:]}\n{err[-3000:]}"
        return out


@pytest.fixture
def bench():
    tmp = Path(tempfile.mkdtemp(prefix="hvb-", dir="/tmp"))
    yield Bench(tmp)
    kill_pids(pids_naming(str(tmp)))
    shutil.rmtree(tmp, ignore_errors=True)
