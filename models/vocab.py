"""Keypoint and segmentation vocabularies, read from the JSON files in ``models/vocab/``.

The files hold the facts (names, flip pairs, skeleton, OKS sigmas, class lists, class
weights) with their source and, where a value is our choice, a note saying so; code asks
this module and never spells those lists itself.

- ``keypoint_vocab("coco_17" | "coco_wholebody_133" | "goliath_308")`` or
  ``keypoint_vocab_for(K)`` (the set with K keypoints: 17, 133, 308).
- ``seg_vocab("seg_goliath_28" | "seg_lip_20" | "seg_cihp_20" | "seg_sapiens2_29" | "seg_synthetic_7")``.
- ``common_keypoints(model_vocab, label_vocab)``: (model index, label index) pairs both sets
  share, e.g. the 308-keypoint model scored on 133-keypoint labels.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

VOCAB_DIR = Path(__file__).resolve().parent / "vocab"


@dataclass(frozen=True)
class KeypointVocab:
    name: str
    keypoint_names: tuple[str, ...]
    flip_indices: tuple[int, ...]  # flip_indices[i]: the mirrored keypoint of i
    skeleton: tuple[tuple[int, int], ...]  # 0-based pairs
    sigmas: tuple[float, ...]  # OKS sigmas
    common: dict[str, tuple[tuple[int, int], ...]]  # other vocab -> (our index, its index) pairs
    part_groups: dict[str, tuple[int, ...]] = field(default_factory=dict)  # e.g. body, face, left_hand

    @property
    def num_keypoints(self) -> int:
        return len(self.keypoint_names)


@dataclass(frozen=True)
class SegVocab:
    name: str
    classes: tuple[str, ...]
    flip_pairs: tuple[tuple[int, int], ...]  # class ids swapped by a horizontal flip
    class_weights: tuple[float, ...]  # empty when none is known

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def flip_map(self) -> list[int]:
        """``flip_map[c]``: the class id of ``c`` after a horizontal flip."""
        out = list(range(self.num_classes))
        for a, b in self.flip_pairs:
            out[a], out[b] = b, a
        return out


def list_vocabs(kind: str | None = None) -> list[str]:
    """Vocabulary names (``kind``: "keypoints" or "segmentation" to filter)."""
    return [p.stem for p in sorted(VOCAB_DIR.glob("*.json")) if kind is None or _read(p.stem)["kind"] == kind]


@functools.cache
def _read(name: str) -> dict:
    path = VOCAB_DIR / f"{name}.json"
    if not path.is_file():
        known = ", ".join(p.stem for p in sorted(VOCAB_DIR.glob("*.json")))
        raise ValueError(f"unknown vocabulary {name!r}; known: {known}")
    return json.loads(path.read_text())


@functools.cache
def keypoint_vocab(name: str) -> KeypointVocab:
    d = _read(name)
    if d["kind"] != "keypoints":
        raise ValueError(f"vocabulary {name!r} is a {d['kind']} vocabulary, not keypoints")
    common = {
        key.removeprefix("common_with_"): tuple(tuple(p) for p in value)
        for key, value in d.items()
        if key.startswith("common_with_")
    }
    return KeypointVocab(
        name=name,
        keypoint_names=tuple(d["keypoint_names"]),
        flip_indices=tuple(d["flip_indices"]),
        skeleton=tuple(tuple(p) for p in d["skeleton"]),
        sigmas=tuple(d["sigmas"]),
        common=common,
        part_groups={k: tuple(v) for k, v in d.get("part_groups", {}).items()},
    )


def keypoint_vocab_for(num_keypoints: int) -> KeypointVocab | None:
    """The vocabulary with ``num_keypoints`` keypoints (17, 133, 308), None if there is none."""
    for name in list_vocabs("keypoints"):
        vocab = keypoint_vocab(name)
        if vocab.num_keypoints == num_keypoints:
            return vocab
    return None


@functools.cache
def seg_vocab(name: str) -> SegVocab:
    d = _read(name)
    if d["kind"] != "segmentation":
        raise ValueError(f"vocabulary {name!r} is a {d['kind']} vocabulary, not segmentation")
    return SegVocab(
        name=name,
        classes=tuple(d["classes"]),
        flip_pairs=tuple(tuple(p) for p in d["flip_pairs"]),
        class_weights=tuple(d["class_weights"]),
    )


def common_keypoints(model: KeypointVocab, labels: KeypointVocab) -> tuple[tuple[int, int], ...]:
    """(model index, label index) of the keypoints both vocabularies share: identity for the
    same set, else the listed correspondence (either direction)."""
    if model.name == labels.name:
        return tuple((i, i) for i in range(model.num_keypoints))
    if labels.name in model.common:
        return model.common[labels.name]
    if model.name in labels.common:
        return tuple((m, lab) for lab, m in labels.common[model.name])
    raise ValueError(f"no keypoint correspondence between {model.name} and {labels.name} in {VOCAB_DIR}")
