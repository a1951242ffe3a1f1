"""The report's histograms over a manifest streamed in batches: fixed bins, counts merged per batch.

A ``Measure`` is one chart: per batch, one array of values per series (e.g. kept, removed by
this step, removed by another step). Its bins are decided up front from a first pass over the
manifest that keeps only each measure's min and max (``see``); a second pass counts each
batch's values into those bins (``count``) and sums. The bins are exactly those a histogram of
all the values would use (``charts.bin_edges``: the values' range and the threshold), so the
merged counts equal the whole-table histogram's, and ``draw`` gives the same picture. What is
held per measure: two floats, then one count per bin and series. Values that are null, NaN or
infinite are left out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import curation.audit.charts as charts
from curation import schema

KEPT, MINE, OTHER = 0, 1, 2  # a row's outcome, as the score charts split it
OUTCOME_SERIES = (
    ("kept", charts.COLOURS["kept"]),
    ("removed by this step", charts.COLOURS["dropped"]),
    ("removed by another step", charts.COLOURS["other"]),
)


@dataclasses.dataclass
class Measure:
    """One histogram: ``values(batch)`` gives one float array per series (``series``: label, colour)."""

    name: str
    columns: tuple[str, ...]  # what ``values`` reads
    values: Callable[[pa.RecordBatch], list[np.ndarray]]
    series: tuple[tuple[str, str], ...]
    integer: bool = False
    threshold: float | None = None
    lo: float = math.inf
    hi: float = -math.inf
    bins: np.ndarray | None = None
    counts: list[np.ndarray] | None = None

    def see(self, batch: pa.RecordBatch) -> None:
        for v in self.values(batch):
            if v.size:
                self.lo, self.hi = min(self.lo, float(v.min())), max(self.hi, float(v.max()))

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    def fix_bins(self) -> None:
        """The bins, from the range seen (once the first pass is over)."""
        lo, hi = (0.0, 1.0) if self.empty else (self.lo, self.hi)  # as ``charts.histogram`` of no values
        self.bins = charts.bin_edges(lo, hi, threshold=self.threshold, integer=self.integer)
        self.counts = [np.zeros(len(self.bins) - 1, dtype=np.int64) for _ in self.series]

    def count(self, batch: pa.RecordBatch) -> None:
        if self.bins is None:
            self.fix_bins()
        for i, v in enumerate(self.values(batch)):
            self.counts[i] += np.histogram(v, self.bins)[0]

    def draw(self, **labels) -> bytes:
        """The chart (``labels``: ``charts.binned_histogram``'s title, xlabel, threshold_label)."""
        if self.bins is None:  # no batch was counted (a manifest with no rows)
            self.fix_bins()
        series = [(label, c, colour) for (label, colour), c in zip(self.series, self.counts)]
        return charts.binned_histogram(series, self.bins, threshold=self.threshold, **labels)


class Ranges:
    """First pass: each measure's min and max."""

    def __init__(self, measures: list[Measure]) -> None:
        self.measures = measures
        self.columns = tuple(dict.fromkeys(c for m in measures for c in m.columns))

    def add(self, batch: pa.RecordBatch) -> None:
        for m in self.measures:
            m.see(batch)


class Counts(Ranges):
    """Second pass: each measure's counts in its bins."""

    def add(self, batch: pa.RecordBatch) -> None:
        for m in self.measures:
            m.count(batch)


def outcomes(batch: pa.RecordBatch, own: set[str]) -> np.ndarray:
    """Per row: KEPT, MINE (removed for a reason in ``own``) or OTHER."""
    kept = pc.equal(batch.column("status"), schema.KEPT).to_numpy(zero_copy_only=False)
    mine = pc.is_in(batch.column("reason"), value_set=pa.array(sorted(own), pa.string()))
    mine = pc.fill_null(mine, False).to_numpy(zero_copy_only=False)
    return np.where(kept, KEPT, np.where(mine, MINE, OTHER))


def finite(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    return valid & np.isfinite(values)


def column_values(batch: pa.RecordBatch, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(values as float64, which are present) of a numeric column."""
    col = batch.column(column)
    values = pc.cast(pc.fill_null(col, 0), pa.float64()).to_numpy(zero_copy_only=False)
    return values, finite(values, col.is_valid().to_numpy(zero_copy_only=False))


def row_values(
    batch: pa.RecordBatch, value: Callable[[dict], float | None], columns: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """(values, which are present) of ``value(row)`` over the batch's rows as Python dicts of ``columns``."""
    names = [c for c in columns if c in batch.schema.names]
    got = [value(r) for r in batch.select(names).to_pylist()]
    values = np.array([0.0 if x is None else float(x) for x in got], dtype=float)
    return values, finite(values, np.array([x is not None for x in got], dtype=bool))


def split_by_outcome(values: np.ndarray, present: np.ndarray, outcome: np.ndarray) -> list[np.ndarray]:
    return [values[present & (outcome == k)] for k in (KEPT, MINE, OTHER)]
