"""Pick a CLIP head's threshold from labelled images, for the CLIP (and head) weights you have.

    python pipelines/calibrate.py artistic data/labelled --config configs/curate_humans1b.yaml \\
        content.embedding.weights=/models/clip/ViT-L-14.pt
    python pipelines/calibrate.py nsfw data/labelled --config job.yaml --rule precision=0.95 --out nsfw.yaml

``<folder>/positives/`` holds images the filter must drop (paintings, drawings and renders for
``artistic``; NSFW images; watermarked ones; for ``aesthetic``, images below the quality wanted)
and ``<folder>/negatives/`` images it must keep; subfolders count, hidden files do not. Every
image goes through the steps a curation run applies (decode, the CLIP embedding, the filter
itself), built from the job config and its ``key=value`` overrides, with the filter enabled and
its start-up checks run (missing weights: one line naming the setting). An image that does not
decode is counted by its reason and left out.

The threshold is picked by ``--rule``: ``max_f1`` (the default), ``precision=P`` (the highest
recall with precision >= P) or ``recall=R`` (the highest precision with recall >= R), where a
filter's precision is the share of positives among the images it drops and its recall the share
of positives it drops. Candidates lie halfway between neighbouring scores. The run prints the
counts, precision and recall at the chosen threshold and the candidates around it, and writes a
config fragment (``--out``): the section with ``enabled``, the threshold and its ``calibration``
record (the weights' SHA-256, the labelled images' digest and counts, the rule, the date), which
the step reports in stats.json instead of warning at start-up (``curation.filters.thresholds``).
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import datetime
import hashlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa

from curation.decode import Decode
from curation.filters.aesthetic import ContentAesthetic
from curation.filters.artistic import ContentArtistic
from curation.filters.clip_embedding import ContentEmbedding
from curation.filters.model import EMBEDDING_COLUMN, ModelStep
from curation.filters.nsfw import ContentNsfw
from curation.filters.thresholds import UncalibratedThresholdWarning
from curation.filters.watermark import ContentWatermark
from curation.job import content_digest
from curation.recipe import CurationConfig
from curation.schema import EMPTY_FILE, RAW_SCHEMA, READ_FAILED
from curation.steps import RowStep, run_steps_locally, section_of
from infra.config import config_to_dict, load_config

FILTERS: dict[str, type[ModelStep]] = {
    "artistic": ContentArtistic,
    "nsfw": ContentNsfw,
    "watermark": ContentWatermark,
    "aesthetic": ContentAesthetic,
}
DROPS_BELOW = {"aesthetic"}  # min_score drops rows below it; the others drop at or above
LABELS = ("positives", "negatives")
CHUNK = 64  # images decoded and scored at a time
DECIMALS = 6  # of a written threshold (the figures printed are those of the written value)
NOT_SCORED = "not_scored"


@dataclasses.dataclass(frozen=True)
class Rule:
    """How the threshold is picked: ``max_f1``, or a target ``precision`` or ``recall``."""

    kind: str
    target: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Rule:
        kind, _, value = text.partition("=")
        try:
            target = float(value) if value else 0.0
        except ValueError:
            target = -1.0
        if (kind == "max_f1" and not value) or (kind in ("precision", "recall") and 0 < target <= 1):
            return cls(kind, target)
        raise ValueError(f"--rule={text!r}: expected max_f1, precision=P or recall=R with 0 < P, R <= 1")

    def __str__(self) -> str:
        return self.kind if self.kind == "max_f1" else f"{self.kind}={self.target:g}"


@dataclasses.dataclass(frozen=True)
class Point:
    """One candidate threshold and the labelled images it drops and keeps."""

    threshold: float
    tp: int  # positives dropped
    fp: int  # negatives dropped
    fn: int  # positives kept
    tn: int  # negatives kept

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn)

    @property
    def f1(self) -> float:
        return 2 * self.tp / (2 * self.tp + self.fp + self.fn)


# ---- the labelled images, through the curation's own steps ---------------------------------------


def labelled_files(folder: Path) -> dict[str, list[Path]]:
    """The files under ``positives/`` and ``negatives/`` (hidden ones left out), sorted."""
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder (it must hold positives/ and negatives/)")
    files = {}
    for label in LABELS:
        sub = folder / label
        found = sorted(
            p for p in sub.rglob("*") if p.is_file() and not any(n.startswith(".") for n in p.relative_to(sub).parts)
        )
        if not found:
            what = "images the filter must drop" if label == "positives" else "images it must keep"
            raise ValueError(f"{sub}: {'no such folder' if not sub.is_dir() else 'no files'}; put {what} there")
        files[label] = found
    return files


def raw_rows(paths: list[Path], root: Path) -> pa.Table:
    """The reader's raw rows for ``paths`` (an unreadable or empty file carries its reason)."""
    rows = []
    for p in paths:
        row = {"partition": "calibrate", "key": p.relative_to(root).as_posix(), "source": str(p)}
        try:
            raw = p.read_bytes()
        except OSError as err:
            row.update(reason=READ_FAILED, error_message=f"{type(err).__name__}: {err}")
        else:
            row.update(raw=raw, input_bytes=len(raw), reason=None if raw else EMPTY_FILE)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=RAW_SCHEMA)


def build_steps(cfg, name: str) -> list[RowStep]:
    """Decode, the CLIP embedding when the filter reads it, and the filter, enabled and checked."""
    cfg = copy.deepcopy(cfg)
    head_cls = FILTERS[name]
    section_of(cfg, head_cls.section).enabled = True
    head = head_cls.from_config(cfg)
    steps: list[RowStep] = [Decode(cfg.decode)]
    if EMBEDDING_COLUMN in head.columns_read():
        section_of(cfg, ContentEmbedding.section).enabled = True
        steps.append(ContentEmbedding.from_config(cfg))
    steps.append(head)
    with warnings.catch_warnings():  # the threshold is what this run measures
        warnings.simplefilter("ignore", UncalibratedThresholdWarning)
        for step in steps:
            step.check()
    return steps


@dataclasses.dataclass
class Scored:
    """The labelled images' scores, what was left out and why, and their digest."""

    scores: dict[str, np.ndarray]  # label -> scores
    skipped: dict[str, collections.Counter]  # label -> reason -> count
    digest: str  # SHA-256 over (label, key, SHA-256 of the bytes) of every image


def score_images(steps: list[RowStep], files: dict[str, list[Path]], root: Path, column: str) -> Scored:
    """Every file through ``steps`` in chunks: its score, or its reason for having none."""
    scores = {label: [] for label in files}
    skipped = {label: collections.Counter() for label in files}
    lines = []
    for label, paths in files.items():
        for start in range(0, len(paths), CHUNK):
            out = run_steps_locally(raw_rows(paths[start : start + CHUNK], root), steps).to_pydict()
            for key, sha, reason, ok, value in zip(
                out["key"], out["sha256"], out["reason"], out["decode_ok"], out[column], strict=True
            ):
                lines.append(f"{label}/{key}:{sha}")
                if ok and value is not None:
                    scores[label].append(value)
                else:
                    skipped[label][reason or NOT_SCORED] += 1
    for label in files:
        if not scores[label]:
            raise ValueError(
                f"{root / label}: none of its {len(files[label])} files could be scored {dict(skipped[label])}"
            )
    digest = hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()
    return Scored({k: np.asarray(v, np.float64) for k, v in scores.items()}, skipped, digest)


# ---- the threshold -------------------------------------------------------------------------------


def candidates(scores: np.ndarray, drops_below: bool) -> np.ndarray:
    """Thresholds halfway between neighbouring distinct scores, and one that drops every image."""
    v = np.unique(scores)
    edge = np.floor(v[0] * 10**DECIMALS) / 10**DECIMALS
    if drops_below:
        edge = np.ceil(v[-1] * 10**DECIMALS) / 10**DECIMALS + 10**-DECIMALS
    return np.unique(np.round(np.append((v[1:] + v[:-1]) / 2, edge), DECIMALS))


def curve(positives: np.ndarray, negatives: np.ndarray, drops_below: bool) -> list[Point]:
    """Every candidate threshold with its counts, in increasing threshold order."""
    pos, neg = np.sort(positives), np.sort(negatives)
    points = []
    for t in candidates(np.concatenate([pos, neg]), drops_below):
        below_p, below_n = int(np.searchsorted(pos, t, "left")), int(np.searchsorted(neg, t, "left"))
        tp, fp = (below_p, below_n) if drops_below else (len(pos) - below_p, len(neg) - below_n)
        points.append(Point(float(t), tp, fp, len(pos) - tp, len(neg) - fp))
    return points


def choose(points: list[Point], rule: Rule) -> int:
    """The index of the point ``rule`` picks (ties: higher precision, then higher recall)."""
    dropping = [i for i, p in enumerate(points) if p.tp + p.fp]
    if rule.kind == "max_f1":
        return max(dropping, key=lambda i: (points[i].f1, points[i].precision, points[i].recall))
    if rule.kind == "precision":
        ok = [i for i in dropping if points[i].precision >= rule.target]
        key = lambda i: (points[i].recall, points[i].precision)  # noqa: E731
    else:
        ok = [i for i in dropping if points[i].recall >= rule.target]
        key = lambda i: (points[i].precision, points[i].recall)  # noqa: E731
    if not ok:
        best = max(dropping, key=lambda i: getattr(points[i], rule.kind))
        raise ValueError(
            f"--rule={rule}: no threshold reaches {rule.kind} {rule.target:g} on these images (the best is "
            f"{getattr(points[best], rule.kind):.3f}, at {points[best].threshold:g}): label more images, or "
            f"lower the target"
        )
    return max(ok, key=key)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(points: list[Point], chosen: int, around: int = 3) -> str:
    """The candidates around the chosen one, one line each."""
    lines = [
        f"{'threshold':>12} {'dropped pos':>11} {'dropped neg':>11} {'kept pos':>8} {'kept neg':>8} "
        f"{'precision':>9} {'recall':>6} {'F1':>5}"
    ]
    for i in range(max(0, chosen - around), min(len(points), chosen + around + 1)):
        p = points[i]
        lines.append(
            f"{p.threshold:>12g} {p.tp:>11} {p.fp:>11} {p.fn:>8} {p.tn:>8} {_fmt(p.precision):>9} "
            f"{p.recall:>6.3f} {p.f1:>5.3f}{'   <- chosen' if i == chosen else ''}"
        )
    return "\n".join(lines)


# ---- the record and the fragment -----------------------------------------------------------------


def weights_of(steps: list[RowStep]) -> dict[str, str]:
    """SHA-256 of every weight file the steps load, by setting (``content.embedding.weights``, ...)."""
    files = {k: v for s in steps if isinstance(s, ModelStep) for k, v in s.weight_files().items()}
    return {setting: content_digest(path)["sha256"] for setting, path in sorted(files.items())}


def settings_digest(head: ModelStep) -> str:
    """A digest of the filter's other settings (prompts, logit scale, backbone...): the threshold
    holds for the score they give."""
    skip = {head.threshold_setting, "calibration", "enabled", "device", "num_gpus", "num_cpus", "num_actors"}
    settings = {k: v for k, v in config_to_dict(head.cfg).items() if k not in skip | {"batch_size"}}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def record(name: str, cfg, steps: list[RowStep], scored: Scored, point: Point, rule: Rule, folder: Path) -> str:
    """The one-line ``calibration`` record: what the threshold was measured on."""
    head = steps[-1]
    weights = ", ".join(f"{k} sha256:{v}" for k, v in weights_of(steps).items())
    clip = f"CLIP {cfg.content.embedding.model}; " if any(isinstance(s, ContentEmbedding) for s in steps) else ""
    counts = ", ".join(f"{len(scored.scores[k])} {k}" for k in LABELS)
    left_out = sum(sum(c.values()) for c in scored.skipped.values())
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        f"{name} by pipelines/calibrate.py on {when}: {clip}{weights or 'no weight files'}; "
        f"{head.section} settings {settings_digest(head)}; labelled images {folder} (sha256:{scored.digest}): "
        f"{counts} scored, {left_out} left out; rule {rule}: precision {_fmt(point.precision)}, "
        f"recall {point.recall:.3f}"
    )


def fragment(head: ModelStep, threshold: float, calibration: str, summary: str) -> str:
    """The job-config fragment: the section enabled, with the threshold and its record."""
    import yaml

    *groups, leaf = head.section.split(".")
    body = {leaf: {"enabled": True, head.threshold_setting: threshold, "calibration": calibration}}
    for g in reversed(groups):
        body = {g: body}
    comment = "".join(f"# {line}\n" for line in summary.splitlines())
    return comment + yaml.safe_dump(body, sort_keys=False, width=10_000)


# ---- the command ---------------------------------------------------------------------------------


def summary_lines(name: str, steps: list[RowStep], scored: Scored, point: Point, rule: Rule) -> str:
    counts = ", ".join(f"{len(scored.scores[k])} {k}" for k in LABELS)
    left = "; ".join(f"{k}: {dict(c)}" for k, c in scored.skipped.items() if c) or "none"
    setting = f"{steps[-1].section}.{steps[-1].threshold_setting}"
    return "\n".join(
        [
            f"{name}: {counts} scored; left out: {left}",
            f"weights: {', '.join(f'{k} sha256:{v}' for k, v in weights_of(steps).items()) or 'none'}",
            f"rule {rule}: {setting}={point.threshold:g} drops {point.tp} of {point.tp + point.fn} positives "
            f"and {point.fp} of {point.fp + point.tn} negatives: precision {_fmt(point.precision)}, "
            f"recall {point.recall:.3f}, F1 {point.f1:.3f}",
        ]
    )


def calibrate(name: str, folder: Path, cfg, rule: Rule, out: Path) -> str:
    """Score the labelled images, pick the threshold, write the fragment; returns what to print."""
    files = labelled_files(folder)
    steps = build_steps(cfg, name)
    head = steps[-1]
    scored = score_images(steps, files, folder, head.scores[0].column)
    points = curve(scored.scores["positives"], scored.scores["negatives"], name in DROPS_BELOW)
    chosen = choose(points, rule)
    point = points[chosen]
    summary = summary_lines(name, steps, scored, point, rule)
    calibration = record(name, cfg, steps, scored, point, rule, folder.resolve())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(fragment(head, point.threshold, calibration, summary))
    return f"{summary}\n{table(points, chosen)}\nfragment for the job config: {out}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("filter", choices=sorted(FILTERS), help="the filter whose threshold to pick")
    parser.add_argument("folder", type=Path, help="labelled images: positives/ (to drop) and negatives/ (to keep)")
    parser.add_argument("--config", help="the curation job's YAML (its content.* sections configure the models)")
    parser.add_argument("--rule", default="max_f1", help="max_f1 (default), precision=P or recall=R")
    parser.add_argument("--out", type=Path, help="where to write the fragment (default: <filter>_threshold.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value settings, e.g. content.embedding.weights=clip.pt")
    args = parser.parse_intermixed_args(argv)  # options before, between or after the key=value settings
    try:
        rule = Rule.parse(args.rule)
        cfg = load_config(CurationConfig, args.config, args.overrides)
        text = calibrate(args.filter, args.folder, cfg, rule, args.out or Path(f"{args.filter}_threshold.yaml"))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
