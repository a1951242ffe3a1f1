"""The README's `ray job submit` sequence, run as a new user types it: the lines between the
``ray-job-submit`` markers of README.md, in one bash, from the repository root.

What the test changes, and only that: the head's ports (free ones, so it never meets another
Ray on this machine: ``--port=6379`` and ``8265`` replaced, the head's other ports added to
the ``ray start`` line) and where ``$PWD/runs/`` is (a temporary folder holding the demo
corpus). Activating the venv, the token mode, the head's own temp dir, the submit and the
stop by PID run as written. Whatever the lines leave behind is ended by PID afterwards, and
the test fails if there was anything.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from infra.local_cluster import head_ports, kill_pids, pids_naming
from pipelines.demo_corpus import build_demo_corpus
from tests.conftest import REPO

pytestmark = pytest.mark.slow

BLOCK = re.compile(r"<!-- ray-job-submit:begin -->\s*```bash\n(.*?)```\s*<!-- ray-job-submit:end -->", re.S)


def readme_lines() -> str:
    found = BLOCK.findall((REPO / "README.md").read_text())
    assert len(found) == 1, "README.md must hold exactly one ray-job-submit block"
    return found[0]


def test_the_block_is_what_a_new_user_needs():
    lines = readme_lines()
    assert lines.index("source .venv/bin/activate") < lines.index("ray start --head")  # the head's python is the venv's
    assert "export RAY_AUTH_MODE=token" in lines.split("ray start")[0]
    assert "--node-ip-address=127.0.0.1" in lines and "--dashboard-host=127.0.0.1" in lines
    assert "ray stop" not in lines.replace("`ray stop`", "")  # only named in a comment, never run


def _own_ports(lines: str, runs: Path) -> str:
    ports = head_ports()
    dashboard = ports.pop("dashboard-port")
    for literal in ("--port=6379", "127.0.0.1:8265", "--dashboard-port=8265", "$PWD/runs/"):
        assert literal in lines, f"the README lines no longer contain {literal!r}: update this test's substitutions"
    lines = lines.replace("--port=6379", f"--port={ports.pop('port')}")
    extra = " ".join(f"--{flag}={port}" for flag, port in ports.items())
    lines = lines.replace("--dashboard-port=8265", f"--dashboard-port={dashboard}")
    lines = lines.replace("127.0.0.1:8265", f"127.0.0.1:{dashboard}")
    lines = re.sub(r"^(ray start .*)$", rf"\1 {extra}", lines, count=1, flags=re.M)
    return lines.replace("$PWD/runs/", f"{runs}/")


def test_readme_ray_job_submit_lines_work_as_written(tmp_path):
    runs = tmp_path / "runs"
    expected = build_demo_corpus(runs / "demo" / "raw")
    script = tmp_path / "readme_lines.sh"
    said = tmp_path / "ray_tmp.txt"  # where the lines' RAY_TMP is reported, however they end
    script.write_text(
        f"set -euo pipefail\ntrap 'echo \"${{RAY_TMP:-}}\" > {said}' EXIT\n" + _own_ports(readme_lines(), runs)
    )
    leftovers: list[int] = []
    head = ""
    try:
        # A clean environment, as a new shell has it: no venv on PATH, no Ray variables.
        env = {
            "HOME": str(Path.home()),
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HF_HUB_OFFLINE": "1",
            "YOLO_OFFLINE": "1",
            "YOLO_AUTOINSTALL": "0",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        done = subprocess.run(["bash", str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    finally:
        head = said.read_text().strip() if said.is_file() else ""
        if head.startswith("/tmp/ray-"):
            deadline = time.time() + 60  # `kill` only signals: give the head's processes time to exit
            while (leftovers := pids_naming(head)) and time.time() < deadline:
                time.sleep(2)
            kill_pids(leftovers)
            shutil.rmtree(head, ignore_errors=True)
    assert done.returncode == 0, (
        f"{script.read_text()}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    )
    assert "succeeded" in done.stdout
    assert head.startswith("/tmp/ray-"), f"the lines' head has no temp dir of its own: {head!r}"
    assert not leftovers, f"processes of the head still ran a minute after the README's kill line: {leftovers}"
    stats = json.loads((runs / "job-demo" / "stats.json").read_text())
    assert stats["inputs"] == len(expected) and stats["reconciled"]
    assert stats["kept"] == sum(1 for status, _ in expected.values() if status == "kept")
