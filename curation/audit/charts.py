"""Charts of the audit report, drawn with matplotlib's Agg canvas into PNG bytes.

No pyplot: figures are built on their own canvas, so nothing depends on (or changes) a
global backend and charts render the same headless, in tests and in Ray workers.
"""

from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

COLOURS = {"kept": "#2e7d32", "dropped": "#ef6c00", "error": "#c62828", "other": "#90a4ae", "flow": "#1565c0"}
WIDTH = 8.0


def _figure(height: float) -> Figure:
    fig = Figure(figsize=(WIDTH, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def funnel(steps: list[dict]) -> bytes:
    """Each step's input split into what it passed on and what it removed (inputs at the top)."""
    fig = _figure(0.55 * len(steps) + 1.2)
    ax = fig.add_subplot()
    names = [s["step"] for s in steps]
    outs = np.array([s["out"] for s in steps])
    removed = np.array([s["in"] - s["out"] for s in steps])
    y = np.arange(len(steps))[::-1]
    ax.barh(y, outs, color=COLOURS["flow"], label="passed on")
    ax.barh(y, removed, left=outs, color=COLOURS["dropped"], label="removed")
    top = max(1, max((s["in"] for s in steps), default=1))
    for yi, s in zip(y, steps):
        gone = s["in"] - s["out"]
        ax.text(
            s["in"] + top * 0.01,
            yi,
            f"{s['in']} -> {s['out']}" + (f"  (-{gone})" if gone else ""),
            va="center",
            fontsize=8,
        )
    ax.set_yticks(y, names)
    ax.set_xlim(0, top * 1.25)
    ax.set_xlabel("images")
    ax.set_title("funnel: inputs -> each step -> kept")
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)


def removed_by_reason(entries: list[dict]) -> bytes:
    """Removed images per reason, coloured by status (dropped by a filter, or an input error)."""
    fig = _figure(0.4 * max(1, len(entries)) + 1.2)
    ax = fig.add_subplot()
    y = np.arange(len(entries))[::-1]
    ax.barh(y, [e["count"] for e in entries], color=[COLOURS.get(e["status"], COLOURS["other"]) for e in entries])
    for yi, e in zip(y, entries):
        ax.text(e["count"], yi, f" {e['count']}", va="center", fontsize=8)
    ax.set_yticks(y, [f"{e['reason']} ({e['step']})" for e in entries])
    ax.set_xlabel("images")
    ax.set_title("removed, by reason (orange: dropped, red: input error)")
    ax.margins(x=0.15)
    return _png(fig)


def by_source(groups: list[dict], limit: int = 25) -> bytes:
    """Kept / dropped / errors per source group (the largest ``limit`` groups)."""
    shown = sorted(groups, key=lambda g: (-g["inputs"], g["group"]))[:limit]
    fig = _figure(0.4 * max(1, len(shown)) + 1.2)
    ax = fig.add_subplot()
    y = np.arange(len(shown))[::-1]
    left = np.zeros(len(shown))
    for status in ("kept", "dropped", "error"):
        values = np.array([g[status] for g in shown], dtype=float)
        ax.barh(y, values, left=left, color=COLOURS[status], label=status)
        left += values
    ax.set_yticks(y, [g["group"] for g in shown])
    ax.set_xlabel("images")
    ax.set_title("outcome by source" + (f" (largest {limit} of {len(groups)})" if len(groups) > limit else ""))
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)


def bin_edges(lo: float, hi: float, *, threshold: float | None = None, integer: bool = False) -> np.ndarray:
    """A histogram's bins over values in [lo, hi] (and the threshold): one per integer, else 24."""
    if threshold is not None:
        lo, hi = min(lo, threshold), max(hi, threshold)
    if integer:
        return np.arange(np.floor(lo) - 0.5, np.ceil(hi) + 1.5)
    pad = (hi - lo) * 0.02 or 0.5
    return np.linspace(lo - pad, hi + pad, 25)


def histogram(
    series: list[tuple[str, list[float], str]],
    *,
    title: str,
    xlabel: str,
    threshold: float | None = None,
    threshold_label: str = "",
    integer: bool = False,
) -> bytes:
    """Stacked histogram of ``(label, values, colour)`` series, the threshold as a dashed line."""
    values = [np.asarray(v, dtype=float) for _, v, _ in series]
    everything = np.concatenate(values) if values else np.zeros(0)
    lo = float(everything.min()) if everything.size else 0.0
    hi = float(everything.max()) if everything.size else 1.0
    bins = bin_edges(lo, hi, threshold=threshold, integer=integer)
    counted = [(name, np.histogram(v, bins)[0], colour) for (name, _, colour), v in zip(series, values)]
    return binned_histogram(
        counted, bins, title=title, xlabel=xlabel, threshold=threshold, threshold_label=threshold_label
    )


def binned_histogram(
    series: list[tuple[str, np.ndarray, str]],
    bins: np.ndarray,
    *,
    title: str,
    xlabel: str,
    threshold: float | None = None,
    threshold_label: str = "",
) -> bytes:
    """``histogram`` of counts already binned: ``(label, counts per bin, colour)`` series over ``bins``
    (edges), e.g. merged from a manifest's parts. The same bars as ``histogram`` of the values."""
    fig = _figure(3.0)
    ax = fig.add_subplot()
    centres = (bins[:-1] + bins[1:]) / 2
    ax.hist(
        [centres] * len(series),
        bins=bins,
        weights=[np.asarray(c, dtype=float) for _, c, _ in series],
        stacked=True,
        color=[c for _, _, c in series],
        label=[f"{name} ({int(np.sum(c))})" for name, c, _ in series],
    )
    if threshold is not None:
        ax.axvline(
            threshold, color="black", linestyle="--", linewidth=1.5, label=threshold_label or f"threshold {threshold:g}"
        )
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("images")
    ax.legend(fontsize=8)
    return _png(fig)


def compare(steps: list[str], a: list[int | None], b: list[int | None]) -> bytes:
    """Images each step passed on in version A and in version B, side by side."""
    fig = _figure(0.55 * max(1, len(steps)) + 1.2)
    ax = fig.add_subplot()
    y = np.arange(len(steps))[::-1]
    for offset, values, name, colour in ((0.2, a, "A", COLOURS["other"]), (-0.2, b, "B", COLOURS["flow"])):
        counts = [v or 0 for v in values]
        ax.barh(y + offset, counts, height=0.4, color=colour, label=name)
        for yi, v in zip(y, counts):
            ax.text(v, yi + offset, f" {v}", va="center", fontsize=7)
    ax.set_yticks(y, steps)
    ax.set_xlabel("images passed on")
    ax.set_title("funnel: A vs B")
    ax.legend(loc="lower right", fontsize=8)
    ax.margins(x=0.12)
    return _png(fig)
