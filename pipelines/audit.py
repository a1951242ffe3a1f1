"""Audit a dataset version: terminal summary, HTML report (logged to its curation run), version diff.

    python pipelines/audit.py runs/demo/curated                  # summary + <output>/audit/report.html + MLflow
    python pipelines/audit.py runs/demo/curated --summary        # terminal summary only
    python pipelines/audit.py a1191187dc9fc10f --tracking-uri sqlite:///runs/demo/mlflow.db
    python pipelines/audit.py --diff runs/a runs/b               # <B output>/audit/diff-<A id>.html + MLflow

A version is an output folder, or a dataset version id or name registered in MLflow
(``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``). Reports are logged as artifacts of the
curation run that produced the version (B's, for a diff) unless ``--no-mlflow``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from curation.audit import (
    diff_summary,
    diff_versions,
    load_version,
    render_diff,
    render_report,
    version_summary,
)
from curation.audit.loading import AuditedVersion, tracking_uri_of
from curation.audit.record import log_report, runs_of_version, tag_explore_command
from infra import storage

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no progress bars in the summary


def publish(html: str, v: AuditedVersion, name: str, out: str | None, tag: str, args) -> None:
    """Write the page (``out`` or ``<output>/audit/<name>``) and log it to ``v``'s curation run."""
    fs, root = storage.resolve(out or storage.join(v.uri, "audit", name))
    storage.atomic_write_bytes(fs, root, html.encode())
    print(f"report: {storage.to_uri(fs, root)}")
    if args.no_mlflow:
        return
    if not v.version.run_id:
        print(f"mlflow: not logged (version {v.id} has no curation run: it was curated with tracking disabled)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / name
        local.write_text(html, encoding="utf-8")
        uri = tracking_uri_of(v, args.tracking_uri)
        artifact = log_report(uri, v.version.run_id, str(local), tag)
    print(f"mlflow: {artifact} logged to run {v.version.run_id} ({uri})")


def report(v: AuditedVersion, args) -> None:
    """The report page, logged to ``v``'s curation run, which is also tagged with the explorer's command."""
    logged = not args.no_mlflow and v.version.run_id
    runs = runs_of_version(tracking_uri_of(v, args.tracking_uri), v.id) if logged else None
    page = render_report(v, per_reason=args.samples, kept=args.kept_samples, runs=runs)
    publish(page, v, "report.html", args.out, "audit.report", args)
    if logged:
        print(f"explore: {tag_explore_command(tracking_uri_of(v, args.tracking_uri), v.version.run_id, v.uri)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("version", nargs="?", help="output folder, or dataset version id or name")
    parser.add_argument("--diff", nargs=2, metavar=("A", "B"), help="compare version A (before) with B (after)")
    parser.add_argument("--summary", action="store_true", help="print the terminal summary only (no HTML, no MLflow)")
    parser.add_argument("--out", help="where to write the HTML (default: under the output's audit/ folder)")
    parser.add_argument(
        "--tracking-uri",
        help="MLflow store (default: the run's tracking.uri, $MLFLOW_TRACKING_URI, "
        "or the SQLite store next to the output)",
    )
    parser.add_argument("--no-mlflow", action="store_true", help="neither read from nor log to MLflow")
    parser.add_argument("--samples", type=int, default=12, help="gallery images per reason (default 12)")
    parser.add_argument("--kept-samples", type=int, default=24, help="kept images in the gallery (default 24)")
    args = parser.parse_args(argv)
    if bool(args.diff) == bool(args.version):
        parser.error("give either one version, or --diff A B")
    try:
        if args.diff:
            a, b = (load_version(ref, args.tracking_uri) for ref in args.diff)
            d = diff_versions(a, b, per_reason=args.samples)
            print(diff_summary(d))
            if not args.summary:
                publish(
                    render_diff(d, per_reason=args.samples),
                    b,
                    f"diff-{a.id}.html",
                    args.out,
                    f"audit.diff_from.{a.id}",
                    args,
                )
            return 0
        v = load_version(args.version, args.tracking_uri)
        print(version_summary(v))
        if not args.summary:
            report(v, args)
        return 0
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
