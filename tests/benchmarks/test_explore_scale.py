"""``benchmarks/explore_scale.py`` at its smallest size: a version of 20,000 rows in parts of 2,000,
the real explorer server started on it twice (the index built, then reused), each typical request
sent three times and its answer checked against pyarrow (the script exits non-zero on a mismatch)."""

import re

NUMBER = r"(\d+\.\d+)"


def test_prints_latency_per_request_the_servers_memory_and_the_baseline(bench):
    out = bench("explore_scale.py", "--smallest", timeout=600)
    assert re.search(r"^explorer at scale: parts of 2,000 rows, 3 repetitions per request, ", out, re.M), out
    head = re.search(
        rf"^n= +20,000 \(10 parts, \d+ MB of Parquet, written in \d+ s; load [\d.]+\): server up in {NUMBER} s "
        rf"\(dataset version \w+ \(.+\): 20,000 rows in 10 manifest parts; opened in {NUMBER} s .*\), again {NUMBER} s; "
        r"peak RSS (\d+) MB \(after start-up (\d+) MB\)$",
        out,
        re.M,
    )
    assert head, out
    up, opened, again, peak, start = (float(g) for g in head.groups())
    assert up > opened > 0 and again > 0 and peak >= start > 0
    for name in ("reason page 1", "reason page 1,000", "score range, 1 source", "image + family", "sorted by a score"):
        line = re.search(
            rf"^  {re.escape(name)} +p50 {NUMBER} s  p95 {NUMBER} s   baseline pyarrow.dataset p50 {NUMBER} s "
            rf"\(server / baseline {NUMBER}x\)$",
            out,
            re.M,
        )
        assert line, (name, out)
        p50, p95, base, ratio = (float(g) for g in line.groups())
        assert 0 < p50 <= p95 and base > 0 and ratio > 0
