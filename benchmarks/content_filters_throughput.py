"""Throughput of the content-filter stages on this machine (images/s per stage and batch size).

Each model stage runs through its own code: the CLIP model and the watermark classifier are
randomly initialised with the real architectures, saved to a temporary checkpoint and loaded
back by the stage (random weights cost the same compute as trained ones). The input is real
photos, JPEG-encoded as the decode stage leaves them, cycled to ``--images`` rows; the timed
``process`` includes decoding, preprocessing and the model. Not a test: it prints figures.

    python benchmarks/content_filters_throughput.py --images 32 --batch-sizes 8,32
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow as pa  # noqa: E402
from PIL import Image  # noqa: E402

from curation.filters.artistic import ArtisticFilter, ArtisticFilterConfig  # noqa: E402
from curation.filters.clip_embedding import ClipEmbedding, ClipEmbeddingConfig  # noqa: E402
from curation.filters.text import TextFilter, TextFilterConfig  # noqa: E402
from curation.filters.watermark import WatermarkFilter, WatermarkFilterConfig, build_classifier  # noqa: E402
from curation.schema import BASE_FIELDS  # noqa: E402

ASSETS = Path(__file__).resolve().parents[2] / "shared" / "assets" / "images"


def real_photos() -> list[Image.Image]:
    import importlib.util

    import matplotlib

    paths = sorted(p for p in ASSETS.glob("*") if p.suffix in (".jpg", ".png"))
    packaged = Path(importlib.util.find_spec("ultralytics").origin).parent / "assets"  # not imported
    paths += [packaged / "bus.jpg", packaged / "zidane.jpg"]
    paths.append(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg")
    return [Image.open(p).convert("RGB") for p in paths]


def batch_table(n: int) -> pa.Table:
    photos = real_photos()
    rows = []
    for i in range(n):
        im = photos[i % len(photos)]
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90)
        rows.append({"partition": "bench", "key": f"k{i}", "source": f"bench://{i}", "decode_ok": True,
                     "image": buf.getvalue(), "width": im.width, "height": im.height})
    return pa.Table.from_pylist(rows, schema=pa.schema(BASE_FIELDS))


def timed(stage, table: pa.Table) -> tuple[float, pa.Table]:
    t0 = time.perf_counter()
    out = stage.process(table)
    return time.perf_counter() - t0, out


def report(stage: str, model: str, batch_size: int, n: int, setup_s: float, secs: float) -> None:
    print(f"{stage:16s} {model:34s} {batch_size:6d} {n:7d} {setup_s:8.1f} {secs:8.2f} {n / secs:9.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--batch-sizes", default="8,32")
    ap.add_argument("--clip-model", default="ViT-B-32", help="open_clip architecture (the shipped default is ViT-L-14)")
    ap.add_argument("--watermark-backbone", default="efficientnet_b3")
    ap.add_argument("--ocr-max-sides", default="640,960")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--only", default="embedding,artistic,watermark,text")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    only = set(args.only.split(","))
    table = batch_table(args.images)
    print(f"# {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"cuda={torch.cuda.is_available()}; {args.images} real photos per run (setup = model load)")
    print(f"{'stage':16s} {'model':34s} {'batch':>6s} {'images':>7s} {'setup_s':>8s} {'secs':>8s} {'img/s':>9s}")

    with tempfile.TemporaryDirectory() as tmp:
        embedded = None
        if only & {"embedding", "artistic"}:
            import open_clip

            weights = Path(tmp) / "clip.pt"
            torch.save(open_clip.create_model(args.clip_model).state_dict(), weights)
            clip_cfg = ClipEmbeddingConfig(model=args.clip_model, weights=str(weights))
            for bs in batch_sizes:
                stage = ClipEmbedding(dataclasses.replace(clip_cfg, batch_size=bs))
                t0 = time.perf_counter()
                stage.setup()
                setup_s = time.perf_counter() - t0
                timed(stage, table.slice(0, min(bs, args.images)))  # warm-up
                secs, embedded = timed(stage, table)
                if "embedding" in only:
                    report("clip_embedding", f"{args.clip_model} ({stage.clip.device})", bs, args.images, setup_s, secs)
            if "artistic" in only:
                stage = ArtisticFilter(ArtisticFilterConfig(), clip_cfg)
                t0 = time.perf_counter()
                stage.setup()
                setup_s = time.perf_counter() - t0
                secs, _ = timed(stage, embedded)
                report("artistic_filter", f"zero-shot, {len(stage.prompts.prompts)} prompts", args.images,
                       args.images, setup_s, secs)

        if "watermark" in only:
            weights = Path(tmp) / "watermark.pt"
            torch.save(build_classifier(args.watermark_backbone, (625, 256)).state_dict(), weights)
            for bs in batch_sizes:
                stage = WatermarkFilter(WatermarkFilterConfig(
                    weights=str(weights), backbone=args.watermark_backbone, batch_size=bs))
                t0 = time.perf_counter()
                stage.setup()
                setup_s = time.perf_counter() - t0
                timed(stage, table.slice(0, min(bs, args.images)))
                secs, _ = timed(stage, table)
                report("watermark_filter", f"{args.watermark_backbone}@256 ({stage.classifier.device})", bs,
                       args.images, setup_s, secs)

        if "text" in only:
            for side in (int(s) for s in args.ocr_max_sides.split(",")):
                cfg = TextFilterConfig(max_side=side)
                stage = TextFilter(cfg)
                t0 = time.perf_counter()
                stage.setup()
                setup_s = time.perf_counter() - t0
                timed(stage, table.slice(0, 2))
                secs, _ = timed(stage, table)
                report("text_filter", f"rapidocr det+rec, max_side {side} (1 thr)", cfg.batch_size, args.images,
                       setup_s, secs)


if __name__ == "__main__":
    main()
