"""Latency of the explorer's typical queries and the server's memory as the manifest grows: 1e6, 1e7 rows.

    python benchmarks/explore_scale.py --sizes 1e6 1e7        # the issue's two sizes
    python benchmarks/explore_scale.py --smallest             # 2e4 rows, 3 repetitions (the smoke test's run)
    python benchmarks/explore_scale.py --sizes 1e7 --workdir /data/x   # keep (and reuse) the versions written

Per size n, a finished version of n rows is written in the real layout by ``audit_scale.py``'s
generator (``write_version``: the real manifest schema in Parquet parts of ``--rows-per-part``
rows, stats.json, config.yaml and _SUCCESS; no pixels, so no thumbnail is requested). The real
server is started (``python pipelines/explore.py <version> --port 0``, a process of its own,
with an empty cache folder, so its start-up builds the version's index), then every typical
request is sent ``--reps`` times over HTTP, one at a time, and timed end to end (the page's
HTML included): page 1 and page 1,000 of a drop reason (rotating over the three largest), a
score range (sharpness 10-12) from one source (one input tar, rotating), and an image's page
with its near-duplicate family (a different duplicate each time); plus a gallery sorted by a
score (a top-k over every row of its reason). Printed: p50 and p95 per request; the server's
start-up, its index build, a second start-up (index reused); its peak RSS (VmHWM) and RSS after
start-up. Each answer is checked: the count the page shows against stats.json, page 1,000's keys
and the family against the rows read here with pyarrow (a mismatch ends the run).

Baseline in the same run, in this process: the same query with ``pyarrow.dataset`` (the fallback
named in the design: the filter and column projection pushed down, the scan stopped once the
page is full; for a family, a scan of ``duplicate_of``), p50 over the same requests; printed as
the server's p50 over it (the server's figure includes HTTP and HTML, the baseline's does not).
On a shared machine the load average is printed beside each size. Results: docs/results/explore.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
from audit_scale import MIN_SIDE_A, write_version  # this script's folder is first on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RANGE = ("sharpness", 10.0, 12.0)
QUERIES = ("reason page 1", "reason page 1,000", "score range, 1 source", "image + family", "sorted by a score")


def version(folder: str, n: int, rows_per_part: int) -> tuple[str, float]:
    """A finished version of ``n`` rows in ``folder`` (written unless one with its parts is there)."""
    parts = max(1, n // rows_per_part)
    path = os.path.join(folder, f"v{n}")
    manifest = os.path.join(path, "manifest")
    if os.path.isfile(os.path.join(path, "_SUCCESS")) and len(os.listdir(manifest)) == parts:
        return path, 0.0
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    write_version(path, os.path.join(folder, "corpus"), list(range(parts)), rows_per_part, MIN_SIDE_A, renamed=False)
    return path, time.perf_counter() - t0


def start(path: str, cache: str) -> tuple[subprocess.Popen, str, float, str]:
    """The explorer serving ``path``: (process, URL, seconds until it listened, its start-up line)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "pipelines", "explore.py"), path, "--port", "0", "--cache-dir", cache],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("explorer: "):
            return proc, line.split()[1].rstrip("/"), time.perf_counter() - t0, "".join(lines)
    raise SystemExit(f"the explorer did not start:\n{''.join(lines)}\n{proc.stderr.read()[-3000:]}")


def stop(proc: subprocess.Popen) -> dict:
    """Stop the server; its peak and current RSS (MB) read from /proc just before."""
    with open(f"/proc/{proc.pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    proc.terminate()
    proc.wait(timeout=30)
    mb = lambda k: int(status[k].split()[0]) / 1024  # noqa: E731
    return {"peak_mb": mb("VmHWM"), "rss_mb": mb("VmRSS")}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) / 1024 for x in f if x.startswith("VmRSS:"))


def get(url: str, path: str, params: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=120) as r:
            body = r.read().decode()
    except urllib.error.HTTPError as err:
        found = re.search(r'id="error"[^>]*>([^<]*)', err.read().decode())
        sys.exit(f"{path} {params}: HTTP {err.code}: {found.group(1) if found else '?'}")
    return time.perf_counter() - t0, body


def plan(path: str, reps: int) -> dict:
    """What each repetition asks (from the version's stats and rows): reasons, sources, duplicates."""
    import pyarrow.dataset as pads

    stats = json.load(open(os.path.join(path, "stats.json")))
    top = sorted(stats["dropped_by_reason"].items(), key=lambda kv: -kv[1])[:3]
    manifest = os.path.join(path, "manifest")
    parts = sorted(os.path.join(manifest, f) for f in os.listdir(manifest))
    t = pads.dataset(parts[-1]).to_table(columns=["key", "duplicate_of"])
    members = [k for k, d in zip(t.column("key").to_pylist(), t.column("duplicate_of").to_pylist()) if d]
    picked = np.random.default_rng(0).choice(len(members), reps, replace=len(members) < reps)
    sources = [f"{(7 * i) % len(parts):05d}.tar" for i in range(reps)]  # the generator reads part i from tar i
    return {"stats": stats, "reasons": top, "members": [members[i] for i in picked], "sources": sources, "parts": parts}


def requests(p: dict, i: int) -> list[tuple[str, str, dict]]:
    reason, _ = p["reasons"][i % len(p["reasons"])]
    source = p["sources"][i % len(p["sources"])]
    column, lo, hi = RANGE
    return [
        (QUERIES[0], "/images", {"reason": reason}),
        (QUERIES[1], "/images", {"reason": reason, "page": 1000, "page_size": 10}),
        (QUERIES[2], "/images", {"source": source, f"min.{column}": lo, f"max.{column}": hi}),
        (QUERIES[3], "/image", {"key": p["members"][i]}),
        (QUERIES[4], "/images", {"reason": reason, "sort": f"-{column}"}),
    ]


def shown_keys(body: str) -> list[str]:
    return re.findall(r'<figure class="tile" data-key="([^"]+)"', body)


def baseline(p: dict, name: str, params: dict, root: str) -> tuple[float, list[str]]:
    """The same query with pyarrow.dataset in this process: (seconds, keys)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    ds, t0 = pads.dataset(p["parts"]), time.perf_counter()
    field = pads.field
    if name == QUERIES[3]:
        rep = ds.to_table(columns=["duplicate_of"], filter=field("key") == params["key"]).column(0)[0].as_py()
        keys = ds.to_table(columns=["key"], filter=field("duplicate_of") == rep).column("key").to_pylist()
    elif name == QUERIES[4]:
        t = ds.to_table(columns=["key", RANGE[0]], filter=field("reason") == params["reason"])
        keys = t.take(pc.select_k_unstable(t, 48, [(RANGE[0], "descending"), ("key", "ascending")])).column(0)
        keys = keys.to_pylist()
    else:
        condition = field("reason") == params["reason"] if "reason" in params else None
        if "source" in params:
            prefix = f"{root}/{params['source']}#"
            condition = pc.starts_with(field("source"), prefix) & (field(RANGE[0]) >= RANGE[1])
            condition = condition & (field(RANGE[0]) <= RANGE[2])
        skip = (int(params.get("page", 1)) - 1) * int(params.get("page_size", 48))
        head = ds.scanner(columns=["key"], filter=condition).head(skip + int(params.get("page_size", 48)))
        keys = head.column("key").to_pylist()[skip:]
    return time.perf_counter() - t0, keys


def check(name: str, params: dict, body: str, expected: list[str], p: dict) -> None:
    """The page against the baseline's rows and stats.json: a mismatch ends the run."""
    keys = shown_keys(body)
    if name == QUERIES[3]:
        keys = re.findall(r'<tr data-key="([^"]+)" data-status="[^"]+" data-role="member"', body)
        expected = sorted(expected)[: len(keys)]
    elif name == QUERIES[0]:
        total = int(re.search(r'data-total="(\d+)"', body).group(1))
        if total != p["stats"]["dropped_by_reason"][params["reason"]]:
            sys.exit(f"{name} {params}: page says {total}, stats.json {p['stats']['dropped_by_reason']}")
    if name == QUERIES[4]:
        keys = keys[:48]
    if keys != expected:
        sys.exit(f"{name} {params}: the page shows {keys[:5]}..., the baseline {expected[:5]}...")


def measure(path: str, reps: int, cache: str) -> dict:
    p = plan(path, reps)
    proc, url, started, banner = start(path, cache)
    out = {"start_s": started, "banner": banner.strip().splitlines()[0], "rss_start_mb": rss_mb(proc.pid)}
    times: dict[str, list] = {q: [] for q in QUERIES}
    base: dict[str, list] = {q: [] for q in QUERIES}
    root = os.path.join(os.path.dirname(path), "corpus")
    try:
        for i in range(reps):
            for name, route, params in requests(p, i):
                seconds, body = get(url, route, params)
                times[name].append(seconds)
                b_seconds, expected = baseline(p, name, params, root)
                base[name].append(b_seconds)
                check(name, params, body, expected, p)
    finally:
        out.update(stop(proc))
    again, _, out["restart_s"], _ = start(path, cache)
    stop(again)
    out["queries"] = {q: {"p50": np.percentile(t, 50), "p95": np.percentile(t, 95)} for q, t in times.items()}
    out["baseline"] = {q: float(np.percentile(t, 50)) for q, t in base.items()}
    return out


def report(n: int, parts: int, written: float, disk_mb: float, r: dict) -> str:
    head = (
        f"n={n:>11,} ({parts:,} parts, {disk_mb:.0f} MB of Parquet{f', written in {written:.0f} s' if written else ''}; "
        f"load {os.getloadavg()[0]:.1f}): server up in {r['start_s']:.1f} s ({r['banner']}), again {r['restart_s']:.1f} s; "
        f"peak RSS {r['peak_mb']:.0f} MB (after start-up {r['rss_start_mb']:.0f} MB)"
    )
    lines = [head]
    for q, t in r["queries"].items():
        b = r["baseline"][q]
        lines.append(
            f"  {q:<22} p50 {t['p50']:.3f} s  p95 {t['p95']:.3f} s   baseline pyarrow.dataset p50 {b:.3f} s "
            f"(server / baseline {t['p50'] / b:.2f}x)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7])
    parser.add_argument("--rows-per-part", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--workdir", help="where versions are written and kept (default: a temp dir, removed)")
    parser.add_argument("--smallest", action="store_true", help="2e4 rows in parts of 2,000, 3 repetitions")
    args = parser.parse_args()
    sizes, per_part, reps = ([2e4], 2000, 3) if args.smallest else (args.sizes, args.rows_per_part, args.reps)
    work = args.workdir or tempfile.mkdtemp(prefix="explore-scale-")
    os.makedirs(work, exist_ok=True)
    print(
        f"explorer at scale: parts of {per_part:,} rows, {reps} repetitions per request, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at start",
        flush=True,
    )
    peaks = []
    try:
        for n in (int(s) for s in sizes):
            path, written = version(work, n, per_part)
            disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / 2**20
            cache = tempfile.mkdtemp(prefix="cache-", dir=work)
            r = measure(path, reps, cache)
            shutil.rmtree(cache, ignore_errors=True)
            peaks.append((n, r["peak_mb"]))
            print(report(n, max(1, n // per_part), written, disk, r), flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    for (n1, m1), (n2, m2) in zip(peaks, peaks[1:]):
        print(f"growth n x{n2 / n1:.0f}: server peak RSS x{m2 / m1:.2f}")


if __name__ == "__main__":
    main()
