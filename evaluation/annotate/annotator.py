"""The work of an annotation job on one process: samples in, one row of annotations per sample out.

``Annotator`` loads every enabled task's model once (``evaluation.annotate.models``) and
annotates records (``evaluation.annotate.shards.Record``) in chunks of ``actors.batch_size``
samples: decode each image once, then per task its inputs (``tasks.Predictor.inputs``), the
forwards in batches of ``batch_size`` inputs, and each sample's outputs post-processed and
encoded (``finish``). ``annotate_shard`` does a whole shard: read, annotate, write its tar and
table (``shards.write_shard``). A sample that cannot be read, decoded or processed is a row with
``status`` ``missing`` or ``error`` and the reason in ``error``; it never stops the shard.
"""

from __future__ import annotations

import io
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa

import evaluation.annotate.layout as layout
from evaluation.annotate.config import ActorSettings, TasksConfig
from evaluation.annotate.models import ModelInfo, Runner, load_runner
from evaluation.annotate.shards import MISSING, Record, SourceShard, read_shard, write_shard
from evaluation.annotate.tasks import PREDICTORS, Predictor, Sample
from infra import storage

OK, ERROR = "ok", "error"
BASE_FIELDS = [
    pa.field("key", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),  # ok / error (could not decode or process) / missing
    pa.field("error", pa.string()),
    pa.field("width", pa.int32()),
    pa.field("height", pa.int32()),
]


def output_schema(tasks: list[str]) -> pa.Schema:
    """The columns of an annotation table for these tasks (``TASKS`` order)."""
    return pa.schema([*BASE_FIELDS, *(f for t in tasks for f in PREDICTORS[t].fields)])


def decode(record: Record) -> np.ndarray:
    """The sample's RGB pixels (H, W, 3), checked against the size curation recorded."""
    from PIL import Image

    with Image.open(io.BytesIO(record.image)) as im:
        rgb = np.asarray(im.convert("RGB"))
    want = (record.meta.get("height"), record.meta.get("width"))
    if None not in want and rgb.shape[:2] != want:
        raise ValueError(f"the image is {rgb.shape[1]}x{rgb.shape[0]}, curation recorded {want[1]}x{want[0]}")
    return rgb


def _sample(record: Record, rgb: np.ndarray) -> Sample:
    boxes = [list(b) for b in record.meta.get("person_boxes") or []]
    return Sample(record.key, rgb, boxes, [float(s) for s in record.meta.get("person_scores") or []])


def _fail(row: dict, where: str, err: Exception | str) -> None:
    text = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    row["status"] = ERROR
    row["error"] = row["error"] or f"{where}: {text}"


class Annotator:
    """Every enabled task's model, loaded once; ``annotate(records)`` -> rows (see the module doc)."""

    def __init__(self, infos: dict[str, ModelInfo], tasks: TasksConfig, actors: ActorSettings, device: str) -> None:
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
        self.seconds = 0.0

    @property
    def forward_seconds(self) -> float:
        return sum(r.seconds for r in self.runners.values())

    def _row(self, r: Record) -> dict[str, Any]:
        row = dict.fromkeys(self.schema.names)
        meta = r.meta or {}
        row.update(key=r.key, status=OK, width=meta.get("width"), height=meta.get("height"))
        if r.error is not None:
            row.update(status=MISSING if r.image is None else ERROR, error=r.error)
        return row

    def annotate(self, records: list[Record]) -> list[dict[str, Any]]:
        start = time.perf_counter()
        rows = []
        for i in range(0, len(records), self.batch_size):
            rows += self._chunk(records[i : i + self.batch_size])
        self.seconds += time.perf_counter() - start
        return rows

    def _chunk(self, records: list[Record]) -> list[dict[str, Any]]:
        rows = [self._row(r) for r in records]
        samples: dict[int, Sample] = {}
        for i, r in enumerate(records):
            if rows[i]["status"] != OK:
                continue
            try:
                samples[i] = _sample(r, decode(r))
            except Exception as err:  # noqa: BLE001 - one bad image must not fail the shard
                _fail(rows[i], "decode", err)
        for p in self.predictors:
            self._run(p, samples, rows)
        return rows

    def _run(self, p: Predictor, samples: dict[int, Sample], rows: list[dict]) -> None:
        """One task on the chunk's samples: inputs, batched forwards, each sample's outputs."""
        items: list[tuple[int, Any, Any]] = []
        for i, s in samples.items():
            try:
                items += [(i, x, ctx) for x, ctx in p.inputs(s)]
            except Exception as err:  # noqa: BLE001 - a bad box or image fails its sample only
                _fail(rows[i], p.task, err)
        outs = self._forward(p, [x for _, x, _ in items])
        grouped: dict[int, tuple[list, list]] = defaultdict(lambda: ([], []))
        for (i, _, ctx), out in zip(items, outs):
            grouped[i][0].append(out)
            grouped[i][1].append(ctx)
        for i, s in samples.items():
            if rows[i]["status"] != OK:
                continue
            try:
                rows[i].update(p.finish(s, *grouped[i]))
            except Exception as err:  # noqa: BLE001
                _fail(rows[i], p.task, err)

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
    rows = annotator.annotate(read_shard(shard))
    fs, root = storage.resolve(output)
    write_shard(
        fs,
        layout.tar_path(root, shard.id),
        layout.table_path(root, shard.id),
        rows,
        annotator.schema,
        annotator.members,
    )
    statuses = [r["status"] for r in rows]
    return {
        "shard": shard.id,
        "samples": len(rows),
        "ok": statuses.count(OK),
        "errors": len(rows) - statuses.count(OK),
        "seconds": time.perf_counter() - start,
        "forward_seconds": annotator.forward_seconds - forward,
    }
