"""``benchmarks/annotate_throughput.py`` at its smallest size: the plain loop, two plain loops in two
processes and the job on the same samples, their ratios per core and forward shares, and the job
and the loop writing the same bytes."""

import re

import pytest

pytestmark = pytest.mark.slow  # a local Ray cluster and an actor pool

NUMBER = r"\d+\.\d+"


def test_prints_the_job_against_the_same_work_loop(bench):
    out = bench("annotate_throughput.py", "--smallest", "--parallel-loops", timeout=180)
    assert re.search(r"^tiny: 12 samples in 4 shards of 3; batch 8, fp32$", out, re.M), out
    line = (
        rf"^tiny +seg +sapiens2_tiny_seg +trained +loop 1 process +{NUMBER} img/s \(forward +\d+%\) \| "
        rf"2 loop processes +{NUMBER} img/s per core = {NUMBER}x \| "
        rf"job 2 actors +{NUMBER} img/s = +{NUMBER} per core \(forward +\d+%, outside shards +{NUMBER} s per actor\) = "
        rf"{NUMBER}x of the loop per core; "
        r"same bytes: True$"
    )
    assert re.search(line, out, re.M), out
