"""The base of a model step that scores the CLIP embedding with a small network from one file.

LAION-style heads (the NSFW detector, the aesthetic predictor) are a few Linear layers on the
L2-normalised image embedding the pipeline already computes (``clip_embedding``). An
``EmbeddingHead`` step owns what they share: its settings' ``weights`` file, checked at start-up
on the driver (missing: the one-line ``WeightsUnavailableError`` naming the setting; of another
layout, or trained for another embedding width than the configured CLIP model's: a one-line
``ValueError`` naming the file and what it holds), the tensors loaded once per actor onto its
device, and batched scoring of the pending rows that carry an embedding. A subclass names the
file's ``layout`` (state dict -> the widths [D, ..., 1], or the error), its ``forward`` (tensors,
[N, D] -> [N]), the ``score_column`` it writes and ``reason``.

Weights are read with ``torch.load(weights_only=True)`` or safetensors (``model.load_state_file``).

Shapes: N images, D embedding width.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from curation.filters.clip_embedding import ContentEmbeddingConfig, embedding_width
from curation.filters.model import EMBEDDING_COLUMN, ModelStep, embeddings_of, load_state_file
from curation.steps import section_of


class EmbeddingHead(ModelStep):
    """Scores pending rows' ``clip_embedding`` with the network in ``cfg.weights`` (see the module doc)."""

    reads = (EMBEDDING_COLUMN,)
    needs_images = False
    score_column: ClassVar[str]  # the column its value goes to
    weights_what: ClassVar[str]  # what the weights file is, for the error when it is missing

    def __init__(self, cfg: Any, clip: ContentEmbeddingConfig | None = None) -> None:
        super().__init__(cfg)
        self.clip_cfg = clip
        self.tensors: dict | None = None

    @classmethod
    def from_config(cls, job: Any) -> EmbeddingHead:
        return cls(section_of(job, cls.section), section_of(job, "content.embedding"))

    @abc.abstractmethod
    def layout(self, state: dict, where: str) -> list[int]:
        """The widths [D, ..., 1] of the network in ``state``; a ``ValueError`` starting with
        ``where`` and saying what the file holds when it is not this head's layout."""

    @abc.abstractmethod
    def forward(self, tensors: dict, x_ND):
        """The head's values [N] for a float32 tensor of embeddings [N, D] (``tensors``: the state)."""

    def required_files(self) -> dict[str, tuple[str, str]]:
        return {"weights": (self.cfg.weights, self.weights_what)}

    def _where(self) -> str:
        return f"{self.section}.weights={self.cfg.weights!r}"

    def check(self) -> None:
        """The file exists, holds this head's layout, and fits the configured CLIP model's width."""
        super().check()
        width = self.layout(load_state_file(self.cfg.weights), self._where())[0]
        clip = self.clip_cfg
        expected = embedding_width(clip) if clip is not None and clip.enabled else None
        if expected is not None and expected != width:
            raise ValueError(
                f"{self._where()} takes {width}-d embeddings, and content.embedding.model={clip.model!r} "
                f"gives {expected}-d: the head was trained on another CLIP model"
            )

    def load(self) -> None:
        state = load_state_file(self.cfg.weights)
        self.width = self.layout(state, self._where())[0]
        self.tensors = {k: v.float().to(self.device) for k, v in state.items()}

    def predict(self, emb_ND: np.ndarray) -> np.ndarray:
        """The head's value per embedding, float32 [N]."""
        import torch

        if emb_ND.shape[1] != self.width:
            raise ValueError(f"{self._where()} takes {self.width}-d embeddings, the rows hold {emb_ND.shape[1]}-d")
        with torch.inference_mode():
            out_N = self.forward(
                self.tensors, torch.from_numpy(np.ascontiguousarray(emb_ND, np.float32)).to(self.device)
            )
        return out_N.float().cpu().numpy().reshape(-1)

    def score(self, batch: pa.Table, rows: list[int], images: list) -> list[dict | None]:
        wanted = set(rows)
        have, emb_ND = embeddings_of(batch, [i in wanted for i in range(batch.num_rows)], self.name)
        values = dict(zip(have, self.predict(emb_ND).tolist())) if have else {}
        return [{self.score_column: values[i]} if i in values else None for i in rows]
