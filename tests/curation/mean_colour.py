"""A stand-in for the CLIP step (no weights on these machines): the mean RGB as the embedding.
In a module of its own so Ray workers can import it (a class defined in a test module cannot be
unpickled there)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
from PIL import Image

from curation.steps import RowStep


class MeanColour(RowStep):
    section = "mean_colour"
    reads = ("image",)
    fields = [pa.field("clip_embedding", pa.list_(pa.float32()))]

    def process(self, batch: pa.Table) -> pa.Table:
        def mean(data: bytes) -> list[float]:
            return (np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).reshape(-1, 3).mean(axis=0) / 255).tolist()

        vectors = [None if b is None else mean(b) for b in batch.column("image").to_pylist()]
        return batch.append_column("clip_embedding", pa.array(vectors, pa.list_(pa.float32())))
