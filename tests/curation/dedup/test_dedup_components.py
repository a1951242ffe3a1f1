import numpy as np
import pyarrow as pa

from curation.dedup import representative_sort_key
from curation.dedup.components import component_labels, decisions_from_labels


def test_component_labels_are_the_smallest_member_for_any_edge_order():
    a, b = np.array([5, 1, 3, 7]), np.array([3, 0, 5, 8])
    expected = [0, 0, 2, 3, 4, 3, 6, 7, 7]
    assert component_labels(9, a, b).tolist() == expected
    assert component_labels(9, b[::-1], a[::-1]).tolist() == expected
    assert component_labels(3, np.array([], dtype=int), np.array([], dtype=int)).tolist() == [0, 1, 2]


def test_arrow_ranking_equals_the_documented_rule_with_ties_and_nulls():
    rng = np.random.default_rng(0)
    n = 2000
    meta = pa.table(
        {
            "key": [f"r{i:05d}" for i in rng.permutation(n)],
            "width": pa.array([None if rng.random() < 0.05 else int(w) for w in rng.choice([10, 20], n)], pa.int32()),
            "height": pa.array(rng.choice([10, 20], n).astype(np.int32)),
            "person_score_max": pa.array(
                [None if rng.random() < 0.3 else float(s) for s in rng.choice([0.5, 0.9], n)], pa.float32()
            ),
        }
    )
    labels = rng.integers(0, 300, n)
    prefer = set(meta.column("key").to_pylist()[::17])
    groups = {}
    for label, row in zip(labels, meta.to_pylist()):
        groups.setdefault(label, []).append(row)
    expected = []
    for members in groups.values():
        ordered = sorted(members, key=lambda r: representative_sort_key(r, prefer))
        expected += [
            {
                "key": m["key"],
                "reason": "near_duplicate",
                "duplicate_of": ordered[0]["key"],
                "duplicate_group": "g:" + ordered[0]["key"],
            }
            for m in ordered[1:]
        ]
    got = decisions_from_labels(meta, labels, "near_duplicate", "g:", prefer).to_pylist()
    assert got == sorted(expected, key=lambda d: d["key"])
