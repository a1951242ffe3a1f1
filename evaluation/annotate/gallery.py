"""The gallery page of an annotation version: its predictions drawn on a few samples, one
self-contained HTML file (inline CSS, every image a JPEG data URI, no script; the page helpers
of ``curation.audit.page``).

Per sample, one panel per task beside the image: keypoints with the vocabulary's skeleton
(those scoring at least ``MIN_KEYPOINT_SCORE``) and their boxes; seg in the class palette
(``class_palette``) blended over the image, with a legend of the classes shown; normals as RGB (facing the viewer is blue); the pointmap's depth (Z) and relative
depth as colour maps; albedo as RGB. Samples are the ``gallery.samples`` ok rows first by
SHA-1 of their key (deterministic), read back from the annotation tables and source shards.
Every panel and sample carries ``data-*`` attributes for tests to read through the DOM.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import numpy as np

import curation.audit.page as page
import evaluation.annotate.layout as layout
from evaluation.annotate.shards import IMAGE_EXTS, read_tar, source_shards
from infra import storage

THUMB_SIDE = 320
MIN_KEYPOINT_SCORE = 0.3
EXTRA_CSS = """
.sample{display:flex;gap:10px;flex-wrap:wrap;margin:10px 0;padding:8px;background:#f0f4f8;border-radius:8px}
.sample figure{margin:0} .sample img{display:block;max-width:320px;max-height:320px}
.sample figcaption{max-width:320px}
.legend{display:flex;flex-wrap:wrap;gap:6px 14px;font-size:12px}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:4px;vertical-align:middle}
"""


def _jpeg(rgb: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb)).save(out, "JPEG", quality=85)
    return out.getvalue()


def _thumb(rgb: np.ndarray, nearest: bool = False) -> np.ndarray:
    import cv2

    h, w = rgb.shape[:2]
    s = min(1.0, THUMB_SIDE / max(h, w))
    if s == 1.0:
        return rgb
    size = (max(1, round(w * s)), max(1, round(h * s)))
    return cv2.resize(rgb, size, interpolation=cv2.INTER_NEAREST if nearest else cv2.INTER_AREA)


def _npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False).astype(np.float32)


def _png(data: bytes) -> np.ndarray:
    import cv2

    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    return pixels[..., ::-1] if pixels.ndim == 3 else pixels


# ---- panels: (title, RGB thumbnail, caption) --------------------------------------------------------


def pose_panel(image: np.ndarray, row: dict, skeleton: tuple) -> tuple[str, np.ndarray, str]:
    import cv2

    thumb = np.array(_thumb(image))  # a writable copy to draw on
    s = thumb.shape[1] / image.shape[1]
    shown = 0
    for box, kps, scores in zip(row["pose_boxes"], row["pose_keypoints"], row["pose_keypoint_scores"]):
        x1, y1, x2, y2 = (int(round(v * s)) for v in box)
        cv2.rectangle(thumb, (x1, y1), (x2, y2), (255, 200, 0), 1)
        pts = [(int(round(x * s)), int(round(y * s))) for x, y in kps]
        ok = [sc >= MIN_KEYPOINT_SCORE for sc in scores]
        for a, b in skeleton:
            if ok[a] and ok[b]:
                cv2.line(thumb, pts[a], pts[b], (40, 220, 60), 1, cv2.LINE_AA)
        for p, good in zip(pts, ok):
            if good:
                cv2.circle(thumb, p, 2, (240, 40, 40), -1, cv2.LINE_AA)
        shown += sum(ok)
    return "pose", thumb, f"{len(row['pose_boxes'])} people, {shown} keypoints scoring >= {MIN_KEYPOINT_SCORE}"


def seg_panel(image: np.ndarray, row: dict, palette: np.ndarray) -> tuple[str, np.ndarray, str]:
    from evaluation.visualize import blend

    labels = _thumb(_png(row["seg_png"]), nearest=True)
    colours = palette[np.clip(labels, 0, len(palette) - 1)]
    thumb = blend(_thumb(image), colours, alpha=0.6, where_HW=labels > 0)
    return "seg", thumb, f"{len(np.unique(labels))} classes"


def normal_panel(image: np.ndarray, row: dict) -> tuple[str, np.ndarray, str]:
    from evaluation.visualize import normal_to_rgb

    normal = _thumb(_npy(row["normal_npy"]))
    return "normal", normal_to_rgb(normal.transpose(2, 0, 1)), "RGB of (x, -y, -z)"


def _colour_map(values: np.ndarray, name: str, caption: str) -> tuple[str, np.ndarray, str]:
    from evaluation.visualize import scalar_to_rgb

    finite = np.isfinite(values)
    lo, hi = np.percentile(values[finite], [2, 98]) if finite.any() else (0.0, 1.0)
    return (
        name,
        scalar_to_rgb(np.nan_to_num(values), finite, float(lo), float(hi), "turbo"),
        f"{caption} {lo:.3g}..{hi:.3g}",
    )


def pointmap_panel(image: np.ndarray, row: dict) -> tuple[str, np.ndarray, str]:
    z = _thumb(_npy(row["pointmap_npy"]))[..., 2]
    name, rgb, text = _colour_map(z, "pointmap depth", "Z")
    return name, rgb, f"{text}, scale {row['pointmap_scale']:.3g}"


def depth_panel(image: np.ndarray, row: dict) -> tuple[str, np.ndarray, str]:
    return _colour_map(_thumb(_npy(row["depth_npy"])), "depth", "relative depth")


def albedo_panel(image: np.ndarray, row: dict) -> tuple[str, np.ndarray, str]:
    return "albedo", _thumb(_png(row["albedo_png"])), "RGB in [0, 1]"


# ---- reading the samples ---------------------------------------------------------------------------


def _order(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()


def _rows(job: Any, n: int) -> list[tuple[str, dict]]:
    """(shard, row) of the ``n`` ok rows first by SHA-1 of their key, every column; only the
    chosen rows' columns are read."""
    import pyarrow.parquet as pq

    ok: list[tuple[str, str, str]] = []  # (order, key, table)
    for p in layout.committed_tables(job.fs, job.root):
        with job.fs.open_input_file(p) as fh:
            t = pq.read_table(fh, columns=["key", "status"])
        ok += [
            (_order(k), k, p) for k, s in zip(t.column("key").to_pylist(), t.column("status").to_pylist()) if s == "ok"
        ]
    chosen = sorted(ok)[:n]
    rows = {}
    for p in sorted({p for _, _, p in chosen}):
        keys = [k for _, k, q in chosen if q == p]
        with job.fs.open_input_file(p) as fh:
            t = pq.read_table(fh, filters=[("key", "in", keys)])
        shard = p.rsplit("/", 1)[-1].removesuffix(layout.TABLE)
        rows.update({r["key"]: (shard, r) for r in t.to_pylist()})
    return [rows[k] for _, k, _ in chosen]


def _images(job: Any, rows: list[tuple[str, dict]]) -> dict[str, np.ndarray]:
    from PIL import Image

    by_id = {s.id: s for s in source_shards(job.version)}
    out = {}
    for shard in sorted({s for s, _ in rows}):
        members, _ = read_tar(by_id[shard].tar)
        for _, row in rows:
            found = members.get(row["key"], {})
            data = next((found[e] for e in IMAGE_EXTS if e in found), None)
            if data is not None:
                out[row["key"]] = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    return out


# ---- the page ----------------------------------------------------------------------------------------


def _figure(title: str, rgb: np.ndarray, caption: str, key: str) -> str:
    src = page.data_uri("image/jpeg", _jpeg(rgb))
    return (
        f'<figure data-panel="{page.esc(title)}"><img src="{src}" alt="{page.esc(f"{key} {title}")}">'
        f"<figcaption><b>{page.esc(title)}</b> {page.esc(caption)}</figcaption></figure>"
    )


def _panels(job: Any, image: np.ndarray, row: dict, vocabs: dict) -> list[tuple[str, np.ndarray, str]]:
    draw = {
        "pose": lambda: pose_panel(image, row, vocabs["skeleton"]),
        "seg": lambda: seg_panel(image, row, vocabs["palette"]),
        "normal": lambda: normal_panel(image, row),
        "pointmap": lambda: pointmap_panel(image, row),
        "depth": lambda: depth_panel(image, row),
        "albedo": lambda: albedo_panel(image, row),
    }
    return [("image", _thumb(image), f"{image.shape[1]}x{image.shape[0]}")] + [draw[t]() for t in job.infos]


def class_palette(n: int) -> np.ndarray:
    """(n, 3) uint8: black for class 0 (background), then matplotlib's tab20, tab20b and tab20c
    (59 distinct colours; more classes repeat them)."""
    import matplotlib

    colours = [c for name in ("tab20", "tab20b", "tab20c") for c in matplotlib.colormaps[name].colors]
    rgb = [(0, 0, 0)] + [tuple(int(255 * v) for v in colours[i % len(colours)][:3]) for i in range(n - 1)]
    return np.array(rgb, dtype=np.uint8)


def _vocabs(job: Any) -> dict:
    from models.vocab import keypoint_vocab, seg_vocab

    pose, seg = job.infos.get("pose"), job.infos.get("seg")
    classes = seg_vocab(seg.vocab).classes if seg is not None and seg.vocab else ()
    return {
        "skeleton": keypoint_vocab(pose.vocab).skeleton if pose is not None and pose.vocab else (),
        "classes": classes,
        "palette": class_palette(max(len(classes), 256 if not classes else 2)),
    }


def legend(classes: tuple[str, ...], palette: np.ndarray, shown: set[int]) -> str:
    items = []
    for c in sorted(shown):
        r, g, b = (int(v) for v in palette[min(c, len(palette) - 1)])
        name = classes[c] if c < len(classes) else f"class {c}"
        items.append(
            f'<span data-class="{c}"><span class="swatch" style="background:rgb({r},{g},{b})"></span>'
            f"{page.esc(name)}</span>"
        )
    return f'<div class="legend">{"".join(items)}</div>'


def _models_table(job: Any) -> str:
    rows = [
        [t, i.name, i.layout, "x".join(map(str, i.input_hw)), i.sha256[:16], "onnx" if i.onnx else "torch"]
        for t, i in job.infos.items()
    ]
    return page.table(["task", "model", "layout", "input (HxW)", "sha256", "runs on"], rows)


def render(job: Any, samples: list[tuple[dict, np.ndarray]], stats: dict | None = None) -> str:
    vocabs = _vocabs(job)
    blocks, shown = [], set()
    for row, image in samples:
        figures = "".join(_figure(t, rgb, c, row["key"]) for t, rgb, c in _panels(job, image, row, vocabs))
        blocks.append(f'<div class="sample" data-key="{page.esc(row["key"])}">{figures}</div>')
        if row.get("seg_png") is not None:
            shown |= {int(c) for c in np.unique(_png(row["seg_png"]))}
    parts = [page.Markup(f"<style>{EXTRA_CSS}</style>"), _models_table(job)]
    if "seg" in job.infos:
        parts.append(page.Markup(f"<h3>seg classes shown</h3>{legend(vocabs['classes'], vocabs['palette'], shown)}"))
    header = [
        f"annotation version {job.version_id} of dataset version {job.version.id} ({job.version.uri})",
        f"{len(samples)} samples, first by SHA-1 of their key; annotations in {storage.join(job.uri, layout.ANNOTATIONS)}",
    ]
    sections = [
        page.section("models", "Models", *map(page.Markup, parts)),
        page.section("samples", "Predictions", *map(page.Markup, blocks)),
    ]
    return page.document(f"Annotations {job.version_id}", header, sections)


def write_gallery(job: Any) -> str:
    """Draw ``gallery.samples`` ok samples into ``gallery.html`` in the output folder; its path."""
    rows = _rows(job, job.cfg.gallery.samples)
    images = _images(job, rows)
    html = render(job, [(r, images[r["key"]]) for _, r in rows if r["key"] in images])
    path = layout.path(job.root, layout.GALLERY_FILE)
    storage.atomic_write_bytes(job.fs, path, html.encode())
    return storage.to_uri(job.fs, path)
