"""Audit of curation outputs: reports, version diffs and terminal summaries for data teams.

For any dataset version (a finished curation output, or a version id / name registered in
MLflow) the audit answers: what went in, what came out, which filter removed what and why,
what the removed images look like, how this version differs from another, and which runs
used it. Everything is derived from the output's manifest (the source of truth; stats.json
is cross-checked against it), its resolved ``config.yaml`` and its ``_SUCCESS`` marker.

- ``loading``: an output or version reference -> ``AuditedVersion`` (manifest parts, stats,
  config); the manifest is streamed in bounded batches (``batches``, ``scan``), never read whole.
- ``counts``: funnel, reasons and source groups recomputed from the manifest; terminal summary.
- ``settings``: flat config diffs and which settings own each drop reason.
- ``images``: pixels for galleries: kept images from the shards, dropped ones from their sources;
  the galleries' deterministic samples, selected batch by batch.
- ``distributions``: the histograms, bins fixed by a first pass, counts merged over batches.
- ``join``: Grace hash join on local temporary files (the diff's joins by key and by SHA-256).
- ``charts``: matplotlib charts (Agg, PNG bytes).
- ``page``: the self-contained HTML page (inline CSS, images as data URIs, no external URL).
- ``report`` / ``diff`` (computed) and ``diff_page`` (laid out): the two documents; ``record``: logging them to the curation run in MLflow.

Entry point: ``python pipelines/audit.py <output or version> [--summary]`` and
``python pipelines/audit.py --diff A B``.
"""

from curation.audit.diff import VersionDiff, diff_summary, diff_versions
from curation.audit.diff_page import render_diff
from curation.audit.loading import AuditedVersion, load_version
from curation.audit.report import render_report, version_summary

__all__ = [
    "AuditedVersion",
    "VersionDiff",
    "diff_summary",
    "diff_versions",
    "load_version",
    "render_diff",
    "render_report",
    "version_summary",
]
