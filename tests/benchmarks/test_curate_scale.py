"""``benchmarks/curate_scale.py`` at its smallest size: the global steps on 2,000 staged rows and a
later batch of 200 against them, through ``curation.passes.global_dedup`` with the Ray engine,
V's kept samples written to shards of 100 (``curation.finish.write_shards``), and the local
engine's semantic, incremental near and semantic-against decisions equal to Ray's."""

import re

import pytest

pytestmark = pytest.mark.slow  # a local Ray cluster and its Ray Data jobs

NUMBER = r"\d+\.\d"
INT = r"([\d,]+)"


def test_prints_each_global_step_the_ray_local_checks_and_the_baseline(bench):
    out = bench("curate_scale.py", "--smallest")
    assert re.search(r"^curation global steps at scale: .* 1000 rows per partition; stress hashes$", out, re.M), out
    line = re.search(
        rf"^n= +2,000: global steps +{NUMBER} s, {NUMBER} CPU-s; V: exact {NUMBER}, near {NUMBER} \(index B=\d+, "
        rf"\d+ bands, {INT} postings\), semantic {NUMBER}, shards \+ manifest {NUMBER} \({INT} shards of 100 each but the last \({INT}\)\), stats\+version {NUMBER}; "
        rf"B against V: exact {NUMBER}, near {NUMBER} \(index of 2 parts\), semantic {NUMBER}; "
        rf"dropped V exact {INT} near {INT} semantic {INT}, B exact {INT} near {INT} semantic {INT}; kept {INT}; "
        r"driver peak RSS \d+ MB .*; Ray == local: semantic equal \([\d,]+ rows\), B near equal \([\d,]+ rows\), "
        rf"B semantic equal \([\d,]+ rows\); baseline in-process near search {NUMBER} s \(near step / baseline {NUMBER}x\)$",
        out,
        re.M,
    )
    assert line, out
    postings, shards, last, exact, near, semantic, _, b_near, _, kept = (int(g.replace(",", "")) for g in line.groups())
    assert postings > 0 and exact > 0 and near > 0 and semantic > 0 and b_near > 0 and 0 < kept < 2000
    assert (shards - 1) * 100 + last == kept  # every kept sample in exactly one shard
