"""Pixels for the galleries: kept images from the shards, dropped images from their sources.

Only kept images are in the shards (``shards/<partition>.tar``, ``<key>.jpg``); a dropped
image exists only at its ``source``: a file, a tar member (``tar_uri#member``) or a Parquet
row (``parquet_uri#row=N``). Both are decoded with the run's own decode settings
(``curation.decode.decode_image``), so a thumbnail shows the image the filters saw and person
boxes land where the detector put them. Inputs that ended as errors are never decoded again:
their tile is a placeholder with the reason. Reads are grouped per container (one open per tar
or Parquet file); a failure to read becomes that tile's placeholder text, never an exception.

Samples are deterministic: rows sorted by SHA-1 of their key, first N taken. Over a manifest
streamed in batches (``Samples``) each group keeps only its N smallest so far: a bounded,
mergeable selection that picks the same rows as sorting the whole manifest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import io
import tarfile
from collections import defaultdict
from collections.abc import Callable, Hashable
from operator import itemgetter

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

from curation import schema
from curation.audit.counts import split_source
from curation.config import DecodeConfig, InputConfig
from curation.decode import DecodeError, decode_image
from curation.filters.person import Detector, DetectorConfig, box_size
from curation.output import SHARDS
from curation.partitions import parquet_columns
from infra import storage
from infra.config import from_dict

THUMB_SIDE = 200
JPEG_QUALITY = 80


@dataclasses.dataclass(frozen=True)
class Tile:
    """One gallery cell: a JPEG thumbnail, or (when ``jpeg`` is None) a placeholder text."""

    key: str
    status: str
    reason: str | None
    caption: tuple[str, ...]
    jpeg: bytes | None = None
    placeholder: str = ""


@dataclasses.dataclass(frozen=True)
class BoxRule:
    """How to colour person boxes: salient (kept by the rule), confident but small, or below threshold."""

    threshold: float
    min_box_size: float
    measure: str

    def colour(self, box, score: float) -> tuple[str, int]:
        if score < self.threshold:
            return "#9e9e9e", 1
        if box_size(box, self.measure) >= self.min_box_size:
            return "#00c853", 3
        return "#ff9100", 2


def sample_order(key: str) -> str:
    """Where a row stands in the samples: the SHA-1 of its key (hex)."""
    return hashlib.sha1(key.encode()).hexdigest()


def sample(rows: list[dict], n: int) -> list[dict]:
    """``n`` rows picked deterministically (by SHA-1 of the key): the same rows on every run."""
    return sorted(rows, key=lambda r: sample_order(r["key"]))[:n]


class Smallest:
    """The ``n`` items of smallest sort key offered so far: a bounded selection, merged offer by offer."""

    def __init__(self, n: int) -> None:
        self.n, self.items = n, []

    def offer(self, pairs: list[tuple]) -> None:
        """``(sort key, item)`` pairs; equal sort keys keep the order they were offered in."""
        if pairs:
            self.items = heapq.nsmallest(self.n, self.items + pairs, key=itemgetter(0))

    @property
    def full(self) -> bool:
        return len(self.items) >= self.n

    def values(self) -> list:
        return [item for _, item in self.items]


class Samples:
    """``sample`` per group over a manifest streamed in batches: per group (``group_of`` a batch:
    one label per row) the ``size(label)`` rows of smallest ``sample_order``, as Python rows."""

    columns = None  # every column: the sampled rows are shown whole

    def __init__(self, size: Callable[[Hashable], int], group_of: Callable[[pa.RecordBatch], list]) -> None:
        self.size, self.group_of = size, group_of
        self.groups: dict[Hashable, Smallest] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        order = [sample_order(k) for k in batch.column("key").to_pylist()]
        labels = self.group_of(batch)
        picks: dict[Hashable, list[int]] = {}
        for i in sorted(range(len(order)), key=order.__getitem__):
            chosen = picks.setdefault(labels[i], [])
            if len(chosen) < self.size(labels[i]):
                chosen.append(i)
        wanted = sorted(i for chosen in picks.values() for i in chosen)
        rows = dict(zip(wanted, batch.take(pa.array(wanted, pa.int64())).to_pylist()))
        for label, chosen in picks.items():
            self.groups.setdefault(label, Smallest(self.size(label))).offer([(order[i], rows[i]) for i in chosen])

    def rows(self, label: Hashable) -> list[dict]:
        return self.groups[label].values() if label in self.groups else []


def section(config: dict, name: str, cls):
    """A config section of the run as its dataclass; defaults when it no longer parses (older runs)."""
    try:
        return from_dict(cls, config.get(name) or {})
    except (ValueError, TypeError):
        return cls()


def box_rule(config: dict, stats: dict) -> BoxRule | None:
    step = next((s for s in stats.get("steps", []) if s["name"] == Detector.name), None)
    if not step or not step.get("applied"):
        return None
    det = section(config, Detector.section, DetectorConfig)
    return BoxRule(
        float(step.get("score_threshold", det.threshold)),
        float(step.get("min_box_size", det.min_box_size)),
        step.get("box_size_measure", det.box_size_measure),
    )


def _sample_name(member: str) -> str:
    """A tar member's name as sources record it: extension (after the first dot) lower-cased."""
    directory, _, base = member.rpartition("/")
    stem, dot, ext = base.partition(".")
    return f"{directory}/" * bool(directory) + stem + dot + ext.lower()


def read_tar_members(uri: str, names: set[str]) -> dict[str, bytes]:
    """The named members of one tar (local or object store), read in one streaming pass."""
    fs, path = storage.resolve(uri)
    found: dict[str, bytes] = {}
    with fs.open_input_stream(path) as stream, tarfile.open(fileobj=stream, mode="r|*") as tar:
        for member in tar:
            name = _sample_name(member.name)
            if member.isfile() and name in names and name not in found:
                fh = tar.extractfile(member)
                found[name] = fh.read() if fh else b""
                if len(found) == len(names):
                    break
    return found


def read_parquet_rows(uri: str, rows: set[int], input_cfg: InputConfig) -> dict[int, bytes]:
    """Image bytes of the given row numbers of a Parquet input (its image-bytes column)."""
    fs, path = storage.resolve(uri)
    found: dict[int, bytes] = {}
    with fs.open_input_file(path) as fh:
        pf = pq.ParquetFile(fh)
        image_col, _, _ = parquet_columns(pf.schema_arrow.names, input_cfg, uri)
        start = 0
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            wanted = [r for r in rows if start <= r < start + n]
            if wanted:
                column = pf.read_row_group(g, columns=[image_col]).column(0)
                found.update({r: column[r - start].as_py() or b"" for r in wanted})
            start += n
    return found


def fetch(requests: dict[str, str], input_cfg: InputConfig, max_bytes: int) -> dict[str, bytes | str]:
    """``key -> source URI`` to ``key -> bytes`` (or the text of why they could not be read)."""
    by_container: dict[str, dict[str, str]] = defaultdict(dict)
    out: dict[str, bytes | str] = {}
    for key, source in requests.items():
        container, member = split_source(source)
        if member is None:
            try:
                fs, path = storage.resolve(source)
                size = fs.get_file_info(path).size
                if size is not None and size > max_bytes:
                    out[key] = f"{size} bytes: larger than decode.max_bytes"
                else:
                    out[key] = storage.read_bytes(fs, path)
            except (OSError, ValueError) as err:
                out[key] = f"source unavailable: {type(err).__name__}: {err}"
        else:
            by_container[container][key] = member
    for container, members in sorted(by_container.items()):
        try:
            if all(m.startswith("row=") for m in members.values()):
                got = read_parquet_rows(container, {int(m[4:]) for m in members.values()}, input_cfg)
                out.update({k: got.get(int(m[4:]), "row not found in the source") for k, m in members.items()})
            else:
                got = read_tar_members(container, set(members.values()))
                out.update({k: got.get(m, "member not found in the source tar") for k, m in members.items()})
        except (OSError, ValueError, tarfile.TarError, EOFError) as err:
            out.update({k: f"source unavailable: {type(err).__name__}: {err}" for k in members})
    return out


def fetch_kept(output_uri: str, rows: list[dict]) -> dict[str, bytes | str]:
    """Kept images from the version's own shards (one pass per shard)."""
    fs, root = storage.resolve(output_uri)
    requests = {
        r["key"]: f"{storage.to_uri(fs, storage.join(root, SHARDS, r['shard']))}#{r['key']}.jpg"
        for r in rows
        if r.get("shard")
    }
    out = fetch(requests, InputConfig(), 1 << 62)
    out.update({r["key"]: "no shard recorded for this kept row" for r in rows if not r.get("shard")})
    return out


def thumbnail(
    data: bytes, decode_cfg: DecodeConfig, boxes=None, scores=None, rule: BoxRule | None = None, side: int = THUMB_SIDE
) -> bytes:
    """A JPEG of the normalised image, its long side at most ``side``, person boxes drawn when
    given. Raises DecodeError."""
    rgb, _ = decode_image(data, decode_cfg)
    scale = side / max(rgb.size)
    thumb = (
        rgb.resize((max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale))), Image.Resampling.LANCZOS)
        if scale < 1
        else rgb.copy()
    )
    scale = min(scale, 1.0)
    if rule is not None and boxes:
        draw = ImageDraw.Draw(thumb)
        ranked = sorted(zip(boxes, scores or [0.0] * len(boxes)), key=lambda bs: bs[1])  # best drawn last
        for box, score in ranked:
            colour, width = rule.colour(box, score)
            draw.rectangle([c * scale for c in box], outline=colour, width=width)
    buf = io.BytesIO()
    thumb.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def tiles(
    rows: list[dict], caption, *, config: dict, stats: dict, output_uri: str | None = None, side: int = THUMB_SIDE
) -> list[Tile]:
    """Tiles for ``rows`` (already sampled): pixels from ``output_uri``'s shards for kept rows when
    given, else from the sources; errors as placeholders. ``caption(row)`` gives the caption lines;
    thumbnails are at most ``side`` pixels long."""
    decode_cfg = section(config, "decode", DecodeConfig)
    rule = box_rule(config, stats)
    from_shards = [r for r in rows if r["status"] == schema.KEPT and output_uri]
    from_sources = {
        r["key"]: r["source"]
        for r in rows
        if r["status"] == schema.DROPPED or (r["status"] == schema.KEPT and not output_uri)
    }
    data = fetch(from_sources, section(config, "input", InputConfig), decode_cfg.max_bytes)
    if from_shards:
        data.update(fetch_kept(output_uri, from_shards))
    out = []
    for r in rows:
        lines = tuple(caption(r))
        if r["status"] == schema.ERROR:
            text = f"{r['reason']}: {r.get('error_message') or 'not decodable'}"
            out.append(Tile(r["key"], r["status"], r["reason"], lines, placeholder=text[:240]))
            continue
        got = data.get(r["key"], "not fetched")
        if isinstance(got, str):
            out.append(Tile(r["key"], r["status"], r["reason"], lines, placeholder=got[:240]))
            continue
        try:
            jpeg = thumbnail(got, decode_cfg, r.get("person_boxes"), r.get("person_scores"), rule, side)
            out.append(Tile(r["key"], r["status"], r["reason"], lines, jpeg=jpeg))
        except DecodeError as err:
            out.append(Tile(r["key"], r["status"], r["reason"], lines, placeholder=f"{err.reason}: {err}"[:240]))
    return out
