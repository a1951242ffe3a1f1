"""``benchmarks/audit_scale.py`` at its smallest size: two versions of 2,000 rows in parts of 500,
the report, the diff and the whole-table baseline each in a process of its own, their pages' counts
checked against the ones drawn (the script exits non-zero on a mismatch)."""

import re

INT = r"([\d,]+)"
MB = r"(\d+) MB"


def test_prints_each_steps_peak_rss_and_counts_equal_to_the_drawn_ones(bench):
    out = bench("audit_scale.py", "--smallest")
    assert re.search(r"^audit at scale: manifest parts of 500 rows, \d+ columns; B = A with ", out, re.M), out
    line = re.search(
        rf"^n= +2,000 \(4 parts, [\d.]+ MB of Parquet per version, written in [\d.]+ s\): "
        rf"report [\d.]+ s, peak RSS {MB} \(after imports {MB}\); diff [\d.]+ s, peak RSS {MB} \(after imports {MB}\); "
        rf"baseline whole-table load [\d.]+ s, peak RSS {MB} \(table \d+ MB\); page == drawn: inputs 2,000 kept {INT}; "
        rf"diff == planted: added {INT} removed {INT} renamed {INT} kept in both {INT}$",
        out,
        re.M,
    )
    assert line, out
    report, report_floor, diff, diff_floor, baseline, *found = (int(g.replace(",", "")) for g in line.groups())
    kept, added, removed, renamed, both = found
    assert report >= report_floor > 0 and diff >= diff_floor > 0 and baseline > 0
    assert 0 < kept < 2000 and added > 0 and removed > 0 and renamed > 0 and both > 0
    assert removed + renamed + both == kept  # every image A kept is removed, renamed or kept in both
