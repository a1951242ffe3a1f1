"""Throughput of the content-filter stages on this machine, each beside its bare model.

For every stage and batch size the script prints the stage's images/s (``stage.process`` on
JPEG-encoded rows, as the decode stage leaves them: decoding, preprocessing, the model,
writing the columns) and, measured right after it in the same process on the same loaded
model, the **baseline**: the bare model on pre-decoded, pre-processed inputs of the same
batch size (CLIP ``encode_image`` on the preprocessed tensor; the watermark classifier's
forward on the normalised tensor; the zero-shot head on the embeddings; the NSFW and aesthetic
heads' forward on the same embeddings as a tensor on their device; rapidocr det + rec on the
decoded RGB array at ``max_side``). The ratio stage / baseline is what the stage's own
work costs on top of the model. The embedding heads are timed on ``--head-rows`` rows (the
CLIP stage's output repeated) at ``--head-batch-sizes``, their steps' scale: a few small matrix
products per batch, so the rows' conversion to and from Arrow is most of what a step adds. Every stage and every baseline gets the same warm-up
(``--warmup-batches`` batches of its batch size, off the clock); then stage and baseline are
timed alternately ``--repeats`` times and the best pass of each is kept. Both wall-clock
images/s and images per CPU-second of the process are printed: on a loaded machine the
wall-clock rate swings with the neighbours' load, CPU time much less; with ``--threads 1``
(one torch thread; the OCR stage runs ONNX Runtime on one thread) images per CPU-second is
the per-core rate the scale plan multiplies by cores (with more threads it also counts
threads that spin while they wait).

Models are randomly initialised with the real architectures (no weights are downloadable
here; random weights cost the same compute as trained ones), saved to a temporary checkpoint
and loaded back by the stage: CLIP as the shipped default ``ViT-L-14`` and the small
``ViT-B-32`` (``--clip-models``), the watermark classifier as LAION's efficientnet_b3 + MLP, the
NSFW and aesthetic heads in the layouts of LAION's detector (NeMo Curator's port: 64-512-256-1
after the normalisation) and aesthetic predictor v2 (1024-128-64-16-1), on the CLIP model's width.
Inputs are real photos cycled to ``--images`` rows. Not a test: it prints figures.

    python benchmarks/content_filters_throughput.py --threads 1     # ~10 min on 2 quiet cores
    python benchmarks/content_filters_throughput.py --quick         # 8 images, batch 8, OCR at 640

Results: docs/results/content_filters.md.
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

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from PIL import Image  # noqa: E402

from curation.filters.aesthetic import LAYERS, ContentAesthetic, ContentAestheticConfig  # noqa: E402
from curation.filters.artistic import ContentArtistic, ContentArtisticConfig, zero_shot  # noqa: E402
from curation.filters.clip_embedding import ContentEmbedding, ContentEmbeddingConfig  # noqa: E402
from curation.filters.model import decode_rgb  # noqa: E402
from curation.filters.nsfw import ContentNsfw, ContentNsfwConfig  # noqa: E402
from curation.filters.text import ContentText, ContentTextConfig  # noqa: E402
from curation.filters.watermark import ContentWatermark, ContentWatermarkConfig, build_classifier  # noqa: E402
from curation.schema import BASE_FIELDS  # noqa: E402
from pipelines.demo_corpus import person_photos  # noqa: E402


def real_photos() -> list[Image.Image]:
    return [(Image.open(p) if isinstance(p, Path) else p).convert("RGB") for p in person_photos().values()]


def batch_table(n: int) -> pa.Table:
    photos = real_photos()
    rows = []
    for i in range(n):
        im = photos[i % len(photos)]
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90)
        rows.append(
            {
                "partition": "bench",
                "key": f"k{i}",
                "source": f"bench://{i}",
                "decode_ok": True,
                "image": buf.getvalue(),
                "width": im.width,
                "height": im.height,
            }
        )
    return pa.Table.from_pylist(rows, schema=pa.schema(BASE_FIELDS))


def batches(items, bs: int):
    return [items[i : i + bs] for i in range(0, len(items), bs)]


REPEATS = 2


def clock(fn, warm, timed) -> tuple[float, tuple[float, float], object]:
    """(warm-up wall seconds, (timed wall seconds, timed CPU seconds of this process), last result):
    ``fn`` over the warm-up inputs, then the timed ones."""
    t0 = time.perf_counter()
    for x in warm:
        fn(x)
    t1, c1 = time.perf_counter(), time.process_time()
    out = None
    for x in timed:
        out = fn(x)
    return t1 - t0, (time.perf_counter() - t1, time.process_time() - c1), out


def paired(stage_fn, stage_warm, stage_timed, bare_fn, bare_warm, bare_timed):
    """Stage and bare model, each warmed up the same way, then timed alternately ``REPEATS`` times;
    the best pass of each (the machine is shared: the least disturbed one), wall and CPU time
    separately. Returns (stage warm-up s, stage (wall, cpu) s, bare (wall, cpu) s, the stage's output)."""
    warm_s, _, _ = clock(stage_fn, stage_warm, [])
    clock(bare_fn, bare_warm, [])
    stage_t, bare_t, out = [], [], None
    for _ in range(REPEATS):
        _, t, out = clock(stage_fn, [], stage_timed)
        stage_t.append(t)
        bare_t.append(clock(bare_fn, [], bare_timed)[1])
    best = lambda ts: (min(t[0] for t in ts), min(t[1] for t in ts))  # noqa: E731
    return warm_s, best(stage_t), best(bare_t), out


class Report:
    def __init__(self, n: int, header: bool = True) -> None:
        self.n, self.rows = n, []
        if not header:
            return
        print(f"{'':69s} {'--- wall clock, img/s ---':>28s}  {'-- img per CPU-second --':>36s}")
        print(
            f"{'step':18s} {'model':36s} {'batch':>5s} {'setup_s':>7s} {'stage':>9s} {'bare':>9s} {'ratio':>8s}  "
            f"{'stage':>11s} {'bare':>11s} {'ratio':>12s}"
        )

    def add(self, stage: str, model: str, bs: int, setup_s: float, warm_s: float, stage_t, bare_t):
        r = {
            "stage": stage,
            "model": model,
            "batch": bs,
            "warmup_s": warm_s,
            "stage_ips": self.n / stage_t[0],
            "bare_ips": self.n / bare_t[0],
            "stage_per_cpu_s": self.n / stage_t[1],
            "bare_per_cpu_s": self.n / bare_t[1],
        }
        self.rows.append(r)
        print(
            f"{stage:18s} {model:36s} {bs:5d} {setup_s:7.1f} {r['stage_ips']:9.2f} {r['bare_ips']:9.2f} "
            f"{r['stage_ips'] / r['bare_ips']:8.2f}  {r['stage_per_cpu_s']:11.2f} {r['bare_per_cpu_s']:11.2f} "
            f"{r['stage_per_cpu_s'] / r['bare_per_cpu_s']:12.2f}",
            flush=True,
        )


def head_weights(kind: str, width: int, folder: Path) -> Path:
    """Random weights, saved as a state dict, in the layout of LAION's NSFW detector (``nsfw``) or
    aesthetic predictor v2 (``aesthetic``) for ``width``-d embeddings."""
    import torch

    if kind == "nsfw":
        widths, names = (width, 64, 512, 256, 1), [f"linear_{i}" for i in range(1, 5)]
        state = {"norm.mean": torch.zeros(width), "norm.variance": torch.ones(width)}
    else:
        widths, names, state = (width, 1024, 128, 64, 16, 1), [f"layers.{i}" for i in LAYERS], {}
    for name, (a, b) in zip(names, zip(widths, widths[1:]), strict=True):
        layer = torch.nn.Linear(a, b)
        state |= {f"{name}.weight": layer.weight.detach(), f"{name}.bias": layer.bias.detach()}
    path = folder / f"{kind}-{width}.pth"
    torch.save(state, path)
    return path


def bench_heads(report, embedded: pa.Table, clip_cfg, folder: Path, batch_sizes: list[int], w: int, only: set) -> None:
    """The NSFW and aesthetic steps on the CLIP stage's output rows (repeated to ``report.n``
    rows), each beside its own forward on the same embeddings as a tensor on its device."""
    import torch

    embedded = pa.concat_tables([embedded] * -(-report.n // embedded.num_rows)).slice(0, report.n)
    emb = np.asarray(embedded.column("clip_embedding").to_pylist(), np.float32)
    heads = {"nsfw": (ContentNsfw, ContentNsfwConfig), "aesthetic": (ContentAesthetic, ContentAestheticConfig)}
    for kind, (cls, config) in heads.items():
        if kind not in only:
            continue
        stage = cls(config(weights=str(head_weights(kind, emb.shape[1], folder))), clip_cfg)
        setup_s = setup(stage)
        x = torch.from_numpy(emb).to(stage.device)

        def bare(xb, stage=stage):
            with torch.inference_mode():
                return stage.forward(stage.tensors, xb)

        for bs in batch_sizes:
            stage.cfg = dataclasses.replace(stage.cfg, batch_size=bs)
            warm = [embedded.slice(0, bs)] * w
            warm_s, secs, base, _ = paired(stage.process, warm, [embedded], bare, [x[:bs]] * w, batches(x, bs))
            model = f"LAION {kind} head on {clip_cfg.model} ({stage.device})"
            report.add(stage.name, model, bs, setup_s, warm_s, secs, base)


def setup(stage) -> float:
    t0 = time.perf_counter()
    stage.setup()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=16, help="timed images per stage and per baseline")
    ap.add_argument("--batch-sizes", default="8,16")
    ap.add_argument("--warmup-batches", type=int, default=1, help="the same for every stage and every baseline")
    ap.add_argument("--clip-models", default="ViT-B-32,ViT-L-14", help="open_clip architectures (shipped: ViT-L-14)")
    ap.add_argument("--watermark-backbone", default="efficientnet_b3")
    ap.add_argument("--ocr-max-sides", default="640,960")
    ap.add_argument("--head-rows", type=int, default=1024, help="rows the embedding heads are timed on")
    ap.add_argument("--head-batch-sizes", default="256", help="batch sizes of the embedding heads")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--only", default="embedding,nsfw,artistic,watermark,aesthetic,text")
    ap.add_argument("--repeats", type=int, default=2, help="timed passes of each stage and baseline (best is kept)")
    ap.add_argument("--quick", action="store_true", help="8 images, batch 8, OCR at 640 only")
    args = ap.parse_args()
    global REPEATS
    REPEATS = args.repeats
    if args.quick:
        args.images, args.batch_sizes, args.ocr_max_sides = 8, "8", "640"

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    only = set(args.only.split(","))
    n, w = args.images, args.warmup_batches
    table = batch_table(n + w * max(batch_sizes + [ContentTextConfig().batch_size]))
    timed_rows = table.slice(0, n)
    print(
        f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), cuda={torch.cuda.is_available()}; {n} real photos timed per row, "
        f"{w} warm-up batch(es) each, best of {args.repeats} alternating passes; setup = model load"
    )
    report = Report(n)
    t_start = time.perf_counter()

    with tempfile.TemporaryDirectory() as tmp:
        for clip_model in args.clip_models.split(",") if only & {"embedding", "nsfw", "artistic", "aesthetic"} else []:
            import open_clip

            weights = Path(tmp) / f"clip-{clip_model}.pt"
            torch.save(open_clip.create_model(clip_model, pretrained=None).state_dict(), weights)
            clip_cfg = ContentEmbeddingConfig(model=clip_model, weights=str(weights))
            stage = ContentEmbedding(clip_cfg)
            setup_s = setup(stage)
            clip = stage.clip
            pil = [decode_rgb(b, **stage.decode_size()) for b in timed_rows.column("image").to_pylist()]
            embedded = None
            for bs in batch_sizes:
                stage.cfg = dataclasses.replace(clip_cfg, batch_size=bs)
                warm = [table.slice(n + i * bs, bs) for i in range(w)]
                x = torch.stack([clip.preprocess(im) for im in pil]).to(clip.device)  # pre-decoded, pre-processed

                def bare(xb, clip=clip):
                    with torch.inference_mode(), clip._autocast():
                        return clip.model.encode_image(xb)

                warm_s, secs, base, embedded = paired(
                    stage.process, warm, [timed_rows], bare, [x[:bs]] * w, batches(x, bs)
                )
                if "embedding" in only:
                    report.add(
                        "content.embedding",
                        f"{clip_model} random init ({clip.device})",
                        bs,
                        setup_s,
                        warm_s,
                        secs,
                        base,
                    )
            heads = Report(args.head_rows, header=False)
            bench_heads(
                heads, embedded, clip_cfg, Path(tmp), [int(b) for b in args.head_batch_sizes.split(",")], w, only
            )
            if "artistic" in only:
                a_stage = ContentArtistic(ContentArtisticConfig(), clip_cfg)
                setup_s = setup(a_stage)
                emb = np.asarray(embedded.column("clip_embedding").to_pylist(), np.float32)
                for bs in batch_sizes:
                    a_stage.cfg = dataclasses.replace(a_stage.cfg, batch_size=bs)
                    warm = [embedded.slice(0, bs)] * w
                    warm_s, secs, base, _ = paired(
                        a_stage.process,
                        warm,
                        [embedded],
                        lambda e, a_stage=a_stage: zero_shot(
                            e, a_stage.class_emb_CD, a_stage.prompts.non_natural, a_stage.cfg.logit_scale
                        ),
                        [emb[:bs]] * w,
                        batches(emb, bs),
                    )
                    report.add(
                        "content.artistic",
                        f"zero-shot on {clip_model}, {len(a_stage.prompts.prompts)} prompts",
                        bs,
                        setup_s,
                        warm_s,
                        secs,
                        base,
                    )
            del stage, clip

        if "watermark" in only:
            weights = Path(tmp) / "watermark.pt"
            torch.save(build_classifier(args.watermark_backbone, (625, 256)).state_dict(), weights)
            wcfg = ContentWatermarkConfig(weights=str(weights), backbone=args.watermark_backbone)
            stage = ContentWatermark(wcfg)
            setup_s = setup(stage)
            clf = stage.classifier
            from curation.filters.model import autocast
            from curation.filters.watermark import _MEAN, _STD

            side = (wcfg.input_size, wcfg.input_size)
            pil = [decode_rgb(b, **stage.decode_size()) for b in timed_rows.column("image").to_pylist()]
            arr = np.stack([np.asarray(im.resize(side, Image.Resampling.BILINEAR), np.float32) for im in pil])
            x = torch.from_numpy(((arr / 255.0 - _MEAN) / _STD).transpose(0, 3, 1, 2).copy()).to(clf.device)

            def bare_wm(xb):
                with torch.inference_mode(), autocast(wcfg.precision, clf.device):
                    return torch.softmax(clf.model(xb).float(), dim=1)

            for bs in batch_sizes:
                stage.cfg = dataclasses.replace(wcfg, batch_size=bs)
                warm = [table.slice(n + i * bs, bs) for i in range(w)]
                warm_s, secs, base, _ = paired(stage.process, warm, [timed_rows], bare_wm, [x[:bs]] * w, batches(x, bs))
                report.add(
                    "content.watermark",
                    f"{args.watermark_backbone}@{wcfg.input_size} ({clf.device})",
                    bs,
                    setup_s,
                    warm_s,
                    secs,
                    base,
                )

        if "text" in only:
            for side in (int(s) for s in args.ocr_max_sides.split(",")):
                cfg = ContentTextConfig(max_side=side)
                stage = ContentText(cfg)
                setup_s = setup(stage)
                bs = cfg.batch_size
                rgb = [np.asarray(decode_rgb(b, **stage.decode_size())) for b in timed_rows.column("image").to_pylist()]
                warm = [table.slice(n + i * bs, bs) for i in range(w)]
                warm_s, secs, base, _ = paired(
                    stage.process,
                    warm,
                    [timed_rows],
                    lambda group, stage=stage: [stage.ocr.read(a) for a in group],
                    [rgb[:bs]] * w,
                    batches(rgb, bs),
                )
                report.add(
                    "content.text", f"rapidocr det+rec, max_side {side} (1 thr)", bs, setup_s, warm_s, secs, base
                )
    print(f"# total {time.perf_counter() - t_start:.0f}s, load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
