"""Artistic / non-natural depiction filter: zero-shot CLIP prompts, optionally a trained linear head.

Each image's CLIP embedding is compared with prompt sets for a natural photo and for non-natural
depictions (painting, drawing, cartoon, 3-D render, illustration, screenshot, sculpture, graphic
design). Prompts of one class are ensembled (mean of their normalised embeddings), classes
compete in a softmax with CLIP's logit scale, and ``artistic_score`` = P(non-natural) = the summed
probability of the non-natural classes. ``artistic_label`` is the best-matching class. A trained
linear head (file), when configured, gives ``artistic_score`` instead; the label stays zero-shot.
Rows scoring >= ``threshold`` get the reason ``artistic``.

No threshold of this score has a source: what P(non-natural) a painting gets depends on the CLIP
weights, the prompts and the logit scale. So the step is off by default; enabled, its threshold
needs a ``calibration`` record, which ``pipelines/calibrate.py artistic`` writes with the threshold
it picks from labelled images, or the step warns at start-up (``curation.filters.thresholds``).

The zero-shot logic is a pure function on embeddings (``zero_shot``), tested on injected vectors.

Shapes: N images, P prompts, C classes, D embedding width.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from curation.filters.clip_embedding import ContentEmbeddingConfig, encode_prompts
from curation.filters.model import EMBEDDING_COLUMN, LinearHead, ModelStep, Placement, embeddings_of
from curation.steps import Score, section_of

ARTISTIC = "artistic"

ARTISTIC_FIELDS = [
    pa.field("artistic_score", pa.float32()),  # P(non-natural depiction)
    pa.field("artistic_label", pa.string()),  # best-matching prompt class
]

DEFAULT_NATURAL_PROMPTS = {
    "photo": [
        "a photo of a person",
        "a photo of people",
        "a candid photo of a person",
        "a photo of a person taken with a phone",
        "a professional photograph of a person",
        "a photo of a crowd of people",
    ],
}

DEFAULT_NON_NATURAL_PROMPTS = {
    "painting": ["a painting of a person", "an oil painting", "a watercolor painting of people", "a painted portrait"],
    "drawing": ["a pencil drawing of a person", "a sketch of a person", "a charcoal drawing", "line art of a person"],
    "cartoon": ["a cartoon of a person", "an anime character", "a comic book drawing", "a caricature"],
    "illustration": [
        "a digital illustration of a person",
        "concept art of a character",
        "vector art of people",
        "clip art of a person",
    ],
    "3d_render": ["a 3D render of a person", "a CGI character", "a video game character", "a 3D model of a human"],
    "screenshot": [
        "a screenshot",
        "a screenshot of a video game",
        "a screenshot of a website",
        "a screenshot of a video call",
    ],
    "sculpture": ["a statue of a person", "a sculpture of a person", "a mannequin", "a wax figure"],
    "graphic_design": ["a poster", "a magazine cover", "a collage of photos", "a meme with text"],
}


@dataclasses.dataclass(kw_only=True)
class ContentArtisticConfig(Placement):
    """Settings of the artistic / non-natural depiction filter (``content.artistic``); ``device``
    is where the prompts are encoded at start."""

    enabled: bool = False  # off until its threshold is calibrated for the CLIP weights at hand
    threshold: float = 0.5  # drop when P(non-natural) >= threshold; measured on nothing: calibrate it
    calibration: str = ""  # what the threshold was measured on (pipelines/calibrate.py writes it)
    natural_prompts: dict[str, list[str]] = dataclasses.field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_NATURAL_PROMPTS.items()}
    )
    non_natural_prompts: dict[str, list[str]] = dataclasses.field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_NON_NATURAL_PROMPTS.items()}
    )
    logit_scale: float = 100.0  # softmax temperature of trained CLIP models
    head_weights: str = ""  # optional linear head on the embedding giving P(non-natural)
    batch_size: int = 256


@dataclasses.dataclass(frozen=True)
class PromptSet:
    """All prompts, flattened, with the class each belongs to."""

    classes: tuple[str, ...]
    non_natural: tuple[bool, ...]  # per class
    prompts: tuple[str, ...]
    prompt_class: tuple[int, ...]  # per prompt: index into classes

    @classmethod
    def from_groups(
        cls, natural: dict[str, list[str]], non_natural: dict[str, list[str]], where: str = "content.artistic"
    ) -> PromptSet:
        if not natural or not non_natural:
            raise ValueError(f"{where}: natural_prompts and non_natural_prompts each need at least one class")
        overlap = set(natural) & set(non_natural)
        if overlap:
            raise ValueError(f"{where}: classes {sorted(overlap)} are both natural and non-natural")
        classes, flags, prompts, owner = [], [], [], []
        for group, is_non_natural in ((natural, False), (non_natural, True)):
            for name, texts in group.items():
                if not texts:
                    raise ValueError(f"{where}: class {name!r} has no prompts")
                owner.extend([len(classes)] * len(texts))
                prompts.extend(texts)
                classes.append(name)
                flags.append(is_non_natural)
        return cls(tuple(classes), tuple(flags), tuple(prompts), tuple(owner))


def class_embeddings(prompt_emb_PD: np.ndarray, prompt_class_P, num_classes: int) -> np.ndarray:
    """Prompt ensembling: each class is the normalised mean of its normalised prompt embeddings."""
    prompt_emb_PD = prompt_emb_PD / np.linalg.norm(prompt_emb_PD, axis=1, keepdims=True)
    owner = np.asarray(prompt_class_P)
    class_CD = np.stack([prompt_emb_PD[owner == c].mean(axis=0) for c in range(num_classes)])
    return (class_CD / np.linalg.norm(class_CD, axis=1, keepdims=True)).astype(np.float32)


def zero_shot(
    image_emb_ND: np.ndarray, class_emb_CD: np.ndarray, non_natural_C, logit_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """P(non-natural) [N] and index of the best class [N] for L2-normalised image embeddings."""
    logits_NC = logit_scale * (image_emb_ND @ class_emb_CD.T)
    z = logits_NC - logits_NC.max(axis=1, keepdims=True)
    probs_NC = np.exp(z)
    probs_NC /= probs_NC.sum(axis=1, keepdims=True)
    score_N = probs_NC[:, np.asarray(non_natural_C, dtype=bool)].sum(axis=1)
    return score_N.astype(np.float32), probs_NC.argmax(axis=1)


class ContentArtistic(ModelStep):
    """Scores pending rows' ``clip_embedding``; sets ``artistic`` where P(non-natural) >= threshold."""

    section = "content.artistic"
    Config = ContentArtisticConfig
    reasons = (ARTISTIC,)
    reads = (EMBEDDING_COLUMN,)
    fields = ARTISTIC_FIELDS
    scores = (Score("artistic_score", "threshold", "P(non-natural depiction)"),)
    needs_images = False
    threshold_setting = "threshold"

    def __init__(
        self, cfg: ContentArtisticConfig, clip: ContentEmbeddingConfig, prompt_embeddings: np.ndarray | None = None
    ) -> None:
        """``prompt_embeddings`` [P, D] (in ``PromptSet`` order) skips encoding the prompts in setup."""
        super().__init__(cfg)
        self.clip_cfg = dataclasses.replace(clip, device=cfg.device)
        self.prompts = PromptSet.from_groups(cfg.natural_prompts, cfg.non_natural_prompts)
        self.prompt_embeddings = prompt_embeddings
        self.class_emb_CD: np.ndarray | None = None
        self.head: LinearHead | None = None

    @classmethod
    def from_config(cls, job) -> ContentArtistic:
        return cls(section_of(job, cls.section), section_of(job, "content.embedding"))

    def check_settings(self) -> None:
        where, c = self.section, self.cfg
        if not 0.0 <= c.threshold <= 1.0:
            raise ValueError(f"{where}.threshold={c.threshold}: a probability in [0, 1]")
        if c.logit_scale <= 0:
            raise ValueError(f"{where}.logit_scale must be > 0")
        PromptSet.from_groups(c.natural_prompts, c.non_natural_prompts, where)

    def required_files(self) -> dict[str, tuple[str, str]]:
        if not self.cfg.head_weights:
            return {}
        return {
            "head_weights": (
                self.cfg.head_weights,
                "the linear head file (or leave head_weights empty for zero-shot only)",
            )
        }

    def load(self) -> None:
        prompt_emb_PD = self.prompt_embeddings
        if prompt_emb_PD is None:
            prompt_emb_PD = encode_prompts(self.clip_cfg, list(self.prompts.prompts))
        if len(prompt_emb_PD) != len(self.prompts.prompts):
            raise ValueError(f"{len(prompt_emb_PD)} prompt embeddings for {len(self.prompts.prompts)} prompts")
        self.class_emb_CD = class_embeddings(prompt_emb_PD, self.prompts.prompt_class, len(self.prompts.classes))
        if self.cfg.head_weights:
            self.head = LinearHead.load(self.cfg.head_weights)

    def score(self, batch: pa.Table, rows: list[int], images: list) -> list[dict | None]:
        mask = [False] * batch.num_rows
        for i in rows:
            mask[i] = True
        have, emb_ND = embeddings_of(batch, mask, self.name)
        out: dict[int, dict] = {}
        if have:
            score_N, best_N = zero_shot(emb_ND, self.class_emb_CD, self.prompts.non_natural, self.cfg.logit_scale)
            if self.head is not None:
                score_N = self.head.predict(emb_ND)
            out = {
                i: {"artistic_score": float(s), "artistic_label": self.prompts.classes[b]}
                for i, s, b in zip(have, score_N, best_N)
            }
        return [out.get(i) for i in rows]

    def reason(self, scores: dict) -> str | None:
        return ARTISTIC if scores["artistic_score"] >= self.cfg.threshold else None

    def settings(self) -> dict:
        return {
            "threshold": self.cfg.threshold,
            "score": "linear_head" if self.cfg.head_weights else "zero_shot",
            "head_weights": self.cfg.head_weights,
            "logit_scale": self.cfg.logit_scale,
            "classes": {
                "natural": sorted(self.cfg.natural_prompts),
                "non_natural": sorted(self.cfg.non_natural_prompts),
            },
        }

    def not_applied(self) -> dict:
        return {**super().not_applied(), "note": "images were not checked for artistic / non-natural depictions"}
