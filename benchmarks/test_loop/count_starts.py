"""What each test starts, and the CPU time it costs: job processes, Ray clusters, Ray Train runs.

    python benchmarks/test_loop/count_starts.py [--checkout DIR] [--baseline DIR] [--out FILE] -- <pytest arguments>
    python benchmarks/test_loop/count_starts.py --compare BEFORE.json AFTER.json

Runs ``python -m pytest -p count_starts <pytest arguments>`` in ``DIR`` (default: this checkout)
in one process (no xdist), with ``sitecustomize.py`` of this folder first on ``PYTHONPATH``
(every Python process of the run then logs its start, each Ray head start and each Ray Train
run: see that file), and samples ``/proc`` every 0.25 s for the CPU time (user + system) of
every process whose environment carries this run's log (the test process, the jobs it starts,
their Ray daemons and workers, C++ ones included). It prints, per test (setup, call and
teardown together, as ``--durations`` counts them):

    wall s, CPU-s, job processes (``pipelines/*.py`` and ``benchmarks/*.py`` scripts), Ray
    clusters started, Ray Train runs, Ray worker processes started, Python processes started

The counts are deterministic for a given test and commit; wall and CPU-s depend on the load of
the machine (CPU-s much less than wall). CPU-s misses processes that lived under 0.25 s and the
last < 0.25 s of each process. ``--baseline`` runs the same tests of another checkout (e.g. a
``git archive`` export of an earlier commit) at the same time, under the same load, and prints
per test file each count before -> after and the CPU-s ratio; ``--compare`` prints that table for
two ``--out`` files of separate runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ the pytest side (-p count_starts)
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Time window of each test (setup + call + teardown), logged beside the processes' events."""
    from sitecustomize import record

    start = time.time()
    yield
    record("test", nodeid=item.nodeid, start=start, end=time.time())


# ------------------------------------------------------------------ the CPU sampler
class CpuSampler(threading.Thread):
    """Every ``every`` s: the CPU ticks each marked process used since the last look."""

    def __init__(self, marker: bytes, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.marker, self.every = marker, every
        self.ours: dict[tuple[int, int], bool] = {}
        self.last: dict[tuple[int, int], int] = {}
        self.names: dict[tuple[int, int], str] = {}
        self.samples: list[tuple[float, int]] = []  # (time, ticks used by marked processes since the last sample)
        self.stop = threading.Event()

    def _ticks(self, pid: int) -> tuple[tuple[int, int], int] | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            return None
        fields = stat[stat.rindex(b")") + 2 :].split()
        key = (pid, int(fields[19]))  # starttime: a reused pid is another process
        if key not in self.ours:
            try:
                self.ours[key] = self.marker in Path(f"/proc/{pid}/environ").read_bytes()
                self.names[key] = (
                    Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200].decode(errors="replace")
                )
            except OSError:
                return None
        return (key, int(fields[11]) + int(fields[12])) if self.ours[key] else None  # utime + stime

    def look(self) -> None:
        used = 0
        for name in os.listdir("/proc"):
            if name.isdigit() and (found := self._ticks(int(name))):
                key, ticks = found
                used += ticks - self.last.get(key, 0)
                self.last[key] = ticks
        self.samples.append((time.time(), used))

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.look()


# ------------------------------------------------------------------ the report
def is_job(argv: list[str]) -> bool:
    script = Path(argv[0]) if argv else Path()
    return script.suffix == ".py" and script.parent.name in ("pipelines", "benchmarks")


def report(events: list[dict], samples: list[tuple[float, int]]) -> list[dict]:
    tests = [e for e in events if e["kind"] == "test"]
    rows = []
    for test in tests:
        inside = [e for e in events if e["kind"] != "test" and test["start"] <= e["t"] <= test["end"]]
        procs = [e for e in inside if e["kind"] == "process"]
        rows.append(
            {
                "test": test["nodeid"],
                "wall_s": test["end"] - test["start"],
                "cpu_s": sum(u for t, u in samples if test["start"] <= t <= test["end"]) / TICK,
                "jobs": sum(is_job(e["argv"]) for e in procs),
                "ray_clusters": sum(e["kind"] == "ray_cluster" for e in inside),
                "ray_train_runs": sum(e["kind"] == "ray_train" for e in inside),
                "ray_workers": sum(bool(e["argv"]) and e["argv"][0].endswith("default_worker.py") for e in procs),
                "python_processes": len({e["pid"] for e in procs}),  # setup_worker.py execs default_worker.py
                "job_scripts": sorted(collections.Counter(Path(e["argv"][0]).name for e in procs if is_job(e["argv"]))),
            }
        )
    return rows


COLUMNS = ("wall_s", "cpu_s", "jobs", "ray_clusters", "ray_train_runs", "ray_workers", "python_processes")
HEADERS = {
    "wall_s": "wall s",
    "cpu_s": "CPU-s",
    "jobs": "job processes",
    "ray_clusters": "Ray clusters",
    "ray_train_runs": "Ray Train runs",
    "ray_workers": "Ray workers",
    "python_processes": "Python processes",
}


def table(rows: list[dict]) -> str:
    lines = ["| test | " + " | ".join(HEADERS[c] for c in COLUMNS) + " |"]
    lines.append("|---" * (len(COLUMNS) + 1) + "|")
    total = {c: sum(r[c] for r in rows) for c in COLUMNS}
    for r in [*rows, {"test": "**total**", **total}]:
        cells = [f"{r[c]:.0f}" if c.endswith("_s") else str(r[c]) for c in COLUMNS]
        lines.append(f"| {r['test']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measure(checkout: Path, pytest_args: list[str]) -> dict:
    """One pytest run in ``checkout`` with the events and the CPU sampler on; its rows."""
    log = Path(tempfile.mkdtemp(prefix="hv-cost-")) / "events.jsonl"
    env = {**os.environ, "HV_COST_LOG": str(log), "PYTHONPATH": f"{HERE}{os.pathsep}{checkout}"}
    sampler = CpuSampler(f"HV_COST_LOG={log}".encode())
    sampler.start()
    cmd = [sys.executable, "-m", "pytest", "-p", "count_starts", *pytest_args]
    code = subprocess.run(cmd, cwd=checkout, env=env).returncode
    time.sleep(1.0)  # what the run left behind still ends inside the last sample
    sampler.stop.set()
    sampler.join()
    sampler.look()
    (log.parent / "cpu_samples.json").write_text(json.dumps(sampler.samples))
    per_process = [[*key, ticks / TICK, sampler.names.get(key, "")] for key, ticks in sampler.last.items()]
    (log.parent / "cpu_per_process.json").write_text(json.dumps(per_process))
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    rows = report(events, sampler.samples)
    outside = sum(u for t, u in sampler.samples) / TICK - sum(r["cpu_s"] for r in rows)
    return {"checkout": str(checkout), "exit": code, "log_dir": str(log.parent), "outside_cpu_s": outside, "rows": rows}


def by_file(rows: list[dict]) -> dict[str, dict]:
    files: dict[str, dict] = {}
    for r in rows:
        f = files.setdefault(r["test"].split("::")[0], {c: 0 for c in COLUMNS})
        for c in COLUMNS:
            f[c] += r[c]
    return files


def comparison(before: list[dict], after: list[dict]) -> str:
    """Per test file: each count before -> after, and CPU-s after / before."""
    b, a = by_file(before), by_file(after)
    lines = ["| file | " + " | ".join(HEADERS[c] for c in COLUMNS) + " | CPU-s after / before |"]
    lines.append("|---" * (len(COLUMNS) + 2) + "|")
    for name in sorted(b.keys() | a.keys()):
        x, y = b.get(name, dict.fromkeys(COLUMNS, 0)), a.get(name, dict.fromkeys(COLUMNS, 0))
        cells = [f"{x[c]:.0f} -> {y[c]:.0f}" if c.endswith("_s") else f"{x[c]} -> {y[c]}" for c in COLUMNS]
        ratio = f"{y['cpu_s'] / x['cpu_s']:.2f}" if x["cpu_s"] else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def show(run: dict) -> None:
    print(f"\n{run['checkout']} (pytest exit {run['exit']}; events and CPU samples in {run['log_dir']})")
    print(table(run["rows"]))
    print(f"CPU-s outside any test (collection, start-up, leftovers): {run['outside_cpu_s']:.0f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", default=str(HERE.parents[1]), help="the checkout whose tests run (default: this one)")
    p.add_argument("--baseline", default="", help="another checkout whose same tests run at the same time")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two --out files; run nothing")
    p.add_argument("--out", default="", help="also write the rows as JSON here (with --baseline: a list of two)")
    p.add_argument("pytest_args", nargs="*")
    args = p.parse_args()
    if args.compare:
        before, after = (json.loads(Path(f).read_text()) for f in args.compare)
        print(comparison(before["rows"], after["rows"]))
        return 0
    checkouts = [Path(c).resolve() for c in (args.baseline, args.checkout) if c]
    runs: list[dict] = [{} for _ in checkouts]

    def one(i: int) -> None:
        runs[i] = measure(checkouts[i], args.pytest_args)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(checkouts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for run in runs:
        show(run)
    if len(runs) == 2:
        print(f"\nbaseline {checkouts[0]} -> {checkouts[1]}, run at the same time:")
        print(comparison(runs[0]["rows"], runs[1]["rows"]))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.out:
        Path(args.out).write_text(json.dumps(runs if len(runs) == 2 else runs[0], indent=1))
    return max(run["exit"] for run in runs)


if __name__ == "__main__":
    sys.exit(main())
