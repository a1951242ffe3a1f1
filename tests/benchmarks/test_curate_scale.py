"""``benchmarks/curate_scale.py`` at its smallest size: the global steps on 2,000 staged rows. Its
timing of the near-dup index wraps ``curation.dedup.steps.write_near_index``: the script exits
non-zero when the near step no longer calls it there, so that seam is checked here too."""

import re

import pytest

pytestmark = pytest.mark.slow  # a local Ray cluster and its Ray Data jobs

NUMBER = r"\d+\.\d"


def test_prints_each_global_step_and_the_baseline(bench):
    out = bench("curate_scale.py", "--smallest")
    assert re.search(r"^curation global steps at scale: .* 1000 rows per partition; uniform hashes$", out, re.M), out
    line = re.search(
        rf"^n= +2,000: global steps +{NUMBER} s \(exact {NUMBER}, near {NUMBER} of which index {NUMBER}: "
        rf"B=\d+, \d+ bands, ([\d,]+) postings; manifest {NUMBER}, stats\+version {NUMBER}\); "
        r"dropped exact ([\d,]+) near ([\d,]+), kept ([\d,]+); driver peak RSS \d+ MB .*"
        rf"baseline in-process near search {NUMBER} s \(near step / baseline {NUMBER}x\)$",
        out,
        re.M,
    )
    assert line, out
    postings, exact, near, kept = (int(g.replace(",", "")) for g in line.groups())
    assert postings > 0 and exact > 0 and near > 0 and 0 < kept < 2000
