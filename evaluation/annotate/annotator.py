"""The work of an annotation job on one process: samples in, one row of annotations per sample out.

``Annotator`` loads every enabled task's model once (``evaluation.annotate.models``) and
annotates records (``evaluation.annotate.shards.Record``) in chunks of ``actors.batch_size``
samples: decode each image once, then per task its inputs (``tasks.Predictor.inputs``), the
forwards in batches of ``batch_size`` inputs, and each sample's outputs post-processed and
encoded (``finish``). ``annotate_shard`` does a whole shard: read, annotate, write its tar and
table (``shards.write_shard``).

A sample is a row with ``status`` ``missing`` or ``error``, a ``reason`` and the ``error`` text
only when the sample itself is to blame (``REASONS``): its shard lacks its image
(``missing_image``) or cannot be read to it (``unreadable_tar``), it has no usable metadata
(``bad_metadata``: none, an unparsable ``<key>.json``, or, when pose runs, person boxes that are
not four finite numbers each with one score per box), its bytes do not decode
(``decode_failed``), or they decode to another size than curation recorded (``size_mismatch``).
Anything else (an exception in input preparation, a forward or post-processing, a
``MemoryError``, an I/O error of the storage) is not a property of the sample: it raises
``AnnotationFailed`` naming the shard, the sample, the task and the step, and fails the job.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

import evaluation.annotate.layout as layout
from evaluation.annotate.config import ActorPoolConfig, TasksConfig
from evaluation.annotate.models import ModelInfo, Runner, load_runner
from evaluation.annotate.shards import (
    BAD_METADATA,
    MISSING,
    MISSING_IMAGE,
    UNREADABLE_TAR,
    Record,
    SourceShard,
    read_shard,
    write_shard,
)
from evaluation.annotate.tasks import PREDICTORS, Predictor, Sample
from infra import storage

OK, ERROR = "ok", "error"
DECODE_FAILED, SIZE_MISMATCH = "decode_failed", "size_mismatch"
REASONS = (MISSING_IMAGE, UNREADABLE_TAR, BAD_METADATA, DECODE_FAILED, SIZE_MISMATCH)
BASE_FIELDS = [
    pa.field("key", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),  # ok / error (the sample's bytes or metadata) / missing
    pa.field("reason", pa.string()),  # one of REASONS when the status is not ok
    pa.field("error", pa.string()),
    pa.field("width", pa.int32()),
    pa.field("height", pa.int32()),
]


class BadSample(Exception):
    """What is wrong with a sample itself: recorded as its row's ``reason`` and ``error``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class AnnotationFailed(RuntimeError):
    """A failure that is not a sample's (see the module docstring): it fails the job."""


@contextlib.contextmanager
def failing_as(what: str) -> Iterator[None]:
    """Any exception of the body but ``BadSample`` as ``AnnotationFailed("<what>: <type>: <message>")``
    (one line; the original is its cause)."""
    try:
        yield
    except (BadSample, AnnotationFailed):
        raise
    except Exception as err:  # noqa: BLE001 - re-raised, with where it happened
        text = " ".join(str(err).split())
        raise AnnotationFailed(f"{what}: {type(err).__name__}{': ' + text if text else ''}") from err


def output_schema(tasks: list[str]) -> pa.Schema:
    """The columns of an annotation table for these tasks (``TASKS`` order)."""
    return pa.schema([*BASE_FIELDS, *(f for t in tasks for f in PREDICTORS[t].fields)])


class _SampleBytes(io.BytesIO):
    """A sample's bytes as Pillow reads them, named by the sample: Pillow's messages quote the file
    object, and an object address would make a re-annotated shard's bytes differ."""

    def __init__(self, data: bytes, key: str) -> None:
        super().__init__(data)
        self.key = key

    def __repr__(self) -> str:
        return f"<sample {self.key!r}>"


def decode(record: Record) -> np.ndarray:
    """The sample's RGB pixels (H, W, 3); ``BadSample`` when its bytes do not decode (Pillow's
    plugins raise almost any exception type on a malformed file) or the header gives another size
    than curation recorded (checked before any pixel is decoded). A ``MemoryError`` is raised as
    it is: curation bounded every image's pixel count, so it is the worker's, not the sample's."""
    from PIL import Image

    try:
        with Image.open(_SampleBytes(record.image, record.key)) as im:
            want = (record.meta.get("width"), record.meta.get("height"))
            if None not in want and im.size != want:
                raise BadSample(
                    SIZE_MISMATCH, f"the image is {im.width}x{im.height}, curation recorded {want[0]}x{want[1]}"
                )
            return np.asarray(im.convert("RGB"))
    except (BadSample, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - hostile bytes can break any plugin's parser
        raise BadSample(DECODE_FAILED, f"{type(err).__name__}: {err}") from None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def person_boxes(record: Record) -> tuple[list[list[float]], list[float]]:
    """The person boxes and scores curation recorded; ``BadSample`` unless each box is four finite
    numbers with one finite score."""
    boxes, scores = record.meta.get("person_boxes") or [], record.meta.get("person_scores") or []
    if not isinstance(boxes, list) or not isinstance(scores, list) or len(boxes) != len(scores):
        raise BadSample(BAD_METADATA, f"person_boxes {boxes!r:.200} and person_scores {scores!r:.200} do not pair up")
    for box, score in zip(boxes, scores):
        if not isinstance(box, list) or len(box) != 4 or not all(map(_number, [*box, score])):
            raise BadSample(BAD_METADATA, f"person box {box!r:.200} (score {score!r}) is not four finite numbers")
    return [[float(v) for v in b] for b in boxes], [float(s) for s in scores]


class Annotator:
    """Every enabled task's model, loaded once; ``annotate(records)`` -> rows (see the module doc)."""

    def __init__(self, infos: dict[str, ModelInfo], tasks: TasksConfig, actors: ActorPoolConfig, device: str) -> None:
        import cv2
        import torch

        self.predictors: list[Predictor] = [PREDICTORS[t](info, tasks.of(t)) for t, info in infos.items()]
        threads = max(1, int(actors.num_cpus))
        torch.set_num_threads(threads)  # the CPUs the actor holds, for the model and the post-processing
        cv2.setNumThreads(threads)
        self.runners: dict[str, Runner] = {
            p.task: load_runner(p.info, device, actors.precision, threads) for p in self.predictors
        }
        self.batch_size = actors.batch_size
        self.schema = output_schema(list(infos))
        self.members = {c: ext for p in self.predictors for c, ext in p.members.items()}
        self.needs_boxes = "pose" in infos  # only pose reads the person boxes
        self.seconds = 0.0

    @property
    def forward_seconds(self) -> float:
        return sum(r.seconds for r in self.runners.values())

    def _row(self, r: Record) -> dict[str, Any]:
        row = dict.fromkeys(self.schema.names)
        meta = r.meta or {}
        row.update(key=r.key, status=OK, width=meta.get("width"), height=meta.get("height"))
        if r.error is not None:
            row.update(status=MISSING if r.image is None else ERROR, reason=r.reason, error=r.error)
        return row

    def annotate(self, records: list[Record]) -> list[dict[str, Any]]:
        start = time.perf_counter()
        rows = []
        for i in range(0, len(records), self.batch_size):
            rows += self._chunk(records[i : i + self.batch_size])
        self.seconds += time.perf_counter() - start
        return rows

    def _sample(self, r: Record) -> Sample:
        rgb = decode(r)
        boxes, scores = person_boxes(r) if self.needs_boxes else ([], [])
        return Sample(r.key, rgb, boxes, scores)

    def _chunk(self, records: list[Record]) -> list[dict[str, Any]]:
        rows = [self._row(r) for r in records]
        samples: dict[int, Sample] = {}
        for i, r in enumerate(records):
            if rows[i]["status"] != OK:
                continue
            try:
                with failing_as(f"sample {r.key!r}, decode"):
                    samples[i] = self._sample(r)
            except BadSample as err:
                rows[i].update(status=ERROR, reason=err.reason, error=str(err))
        for p in self.predictors:
            self._run(p, samples, rows)
        return rows

    def _run(self, p: Predictor, samples: dict[int, Sample], rows: list[dict]) -> None:
        """One task on the chunk's samples: inputs, batched forwards, each sample's outputs."""
        items: list[tuple[int, Any, Any]] = []
        for i, s in samples.items():
            with failing_as(f"sample {s.key!r}, {p.task} input preparation"):
                items += [(i, x, ctx) for x, ctx in p.inputs(s)]
        with failing_as(f"samples {[s.key for s in samples.values()]}, {p.task} forward"):
            outs = self._forward(p, [x for _, x, _ in items])
        grouped: dict[int, tuple[list, list]] = defaultdict(lambda: ([], []))
        for (i, _, ctx), out in zip(items, outs):
            grouped[i][0].append(out)
            grouped[i][1].append(ctx)
        for i, s in samples.items():
            with failing_as(f"sample {s.key!r}, {p.task} post-processing"):
                rows[i].update(p.finish(s, *grouped[i]))

    def _forward(self, p: Predictor, inputs: list) -> list[tuple]:
        """Each input's outputs as (1, ...) tensors, from forwards of ``batch_size`` inputs."""
        import torch

        outs: list[tuple] = []
        for start in range(0, len(inputs), self.batch_size):
            batch = p.infer(self.runners[p.task], torch.stack(inputs[start : start + self.batch_size]))
            outs += [tuple(o[j : j + 1] for o in batch) for j in range(batch[0].shape[0])]
        return outs


def annotate_shard(annotator: Annotator, shard: SourceShard, output: str) -> dict[str, Any]:
    """Read, annotate and write one shard into ``output``; returns its counts and timings."""
    start, forward = time.perf_counter(), annotator.forward_seconds
    try:
        with failing_as(f"reading {shard.tar}"):
            records = read_shard(shard)
        rows = annotator.annotate(records)
    except AnnotationFailed as err:
        raise AnnotationFailed(f"shard {shard.id}: {err}") from err.__cause__
    fs, root = storage.resolve(output)
    write_shard(
        fs,
        layout.tar_path(root, shard.id),
        layout.table_path(root, shard.id),
        rows,
        annotator.schema,
        annotator.members,
    )
    ok = sum(r["status"] == OK for r in rows)
    return {
        "shard": shard.id,
        "samples": len(rows),
        "ok": ok,
        "errors": len(rows) - ok,  # missing or error: their reasons are in the table
        "seconds": time.perf_counter() - start,
        "forward_seconds": annotator.forward_seconds - forward,
    }
