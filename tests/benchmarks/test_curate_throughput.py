"""``benchmarks/curate_throughput.py`` at its smallest size, without the detector half (its actor
pools alone start for longer than this test's budget): the corpus at its stated duplicate share,
both baselines, and the pipeline's runs against them with the judged margin."""

import re

import pytest

pytestmark = pytest.mark.slow  # a local Ray cluster and its Ray Data jobs

NUMBER = r"-?\d+\.\d+"
LOOPS = ("Pillow decode loop", r"same-work loop \(draft decode \+ SHA-256 \+ PHash\)")


def test_prints_both_baselines_and_the_pipeline_against_them(bench):
    out = bench("curate_throughput.py", "--smallest", "--skip-detector")
    assert re.search(r"^corpus: 100 JPEGs, .* 20 duplicates \(20%: .* the 200 for the slope\)", out, re.M), out
    # the 200-image corpus' 20 near copies, each within the near search's 4 bits of its original
    moved = re.search(
        r"^near copies' PHash moved from their originals' \((.*)\); .* \(moved more than 4 bits\)", out, re.M
    )
    assert moved, out
    counts = {int(k): int(v) for k, v in re.findall(r"(\d+) bits: (\d+)", moved.group(1))}
    assert sum(counts.values()) == 20 and max(counts) <= 4, out
    for loop in LOOPS:
        for n in (1, 2):
            assert re.search(
                rf"^{loop}: both together, {n} process(es)? +{NUMBER} img/s +{NUMBER} ms CPU/img", out, re.M
            )
    for size, kept in ((100, 80), (200, 160)):  # pass 1 keeps the distinct 80% at both sizes
        assert re.search(rf"^pipeline, no person detection, {size} images .*\(kept {kept}, 80%\)$", out, re.M), out
    assert re.search(rf"^pipeline, marginal per image \(100 -> 200\) +{NUMBER} img/s", out, re.M), out
    judged = re.findall(rf"^ +per core against the (.*): wall {NUMBER}x of 2 x 1 process, .* <- judged$", out, re.M)
    assert judged == ["same-work loop (draft decode + SHA-256 + PHash)"], out
