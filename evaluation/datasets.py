"""Probe data sets in the formats people have, each a map-style torch ``Dataset`` of dicts.

- ``CocoKeypointDataset``: COCO keypoint JSON (17, 133 or any K keypoints), one top-down
  crop per person box (ground-truth boxes, or a detector's COCO results file); the files are
  read and checked by ``evaluation.coco_keypoints``.
- ``SegmentationDataset``: images + PNG class-index masks, paired by file stem.
- ``DenseMapDataset``: images + float maps (``.npy``/``.exr``) + optional validity masks.
- ``LabeledImageDataset``: images in class sub-folders, or a ``path,label`` CSV (k-NN).

Every item holds ``image`` (3, H, W) float, normalised, at the probe's ``image_size``,
unless ``with_image`` is False (targets only, for training on cached features), and
``index``. Images are resized to ``image_size`` (pose: cropped and resized); the dense
targets are resized with nearest neighbour, so metrics are computed at probe resolution.
Malformed inputs raise ``ValueError`` naming the file (and the annotation) at fault.
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from evaluation.coco_keypoints import PersonInstance, detector_instances, load_coco_keypoints
from evaluation.depth import relative_depth_target
from evaluation.heatmaps import apply_affine, box_to_affine, encode_heatmaps
from evaluation.io import (
    FLOAT_MAP_SUFFIXES,
    IMAGE_SUFFIXES,
    find_by_stem,
    read_binary_mask,
    read_class_mask,
    read_float_map,
    read_rgb,
)

# Sapiens' normalisation (ImageNet statistics on 0-255 pixels).
PIXEL_MEAN = np.array([123.675, 116.28, 103.53], dtype=np.float32)
PIXEL_STD = np.array([58.395, 57.12, 57.375], dtype=np.float32)


def to_tensor(rgb_HW3: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(((rgb_HW3.astype(np.float32) - PIXEL_MEAN) / PIXEL_STD).transpose(2, 0, 1).copy())


def resize(arr: np.ndarray, hw: tuple[int, int], nearest: bool = False) -> np.ndarray:
    import cv2

    if arr.shape[:2] == tuple(hw):
        return arr
    interp = cv2.INTER_NEAREST if nearest else cv2.INTER_LINEAR
    out = cv2.resize(arr, (hw[1], hw[0]), interpolation=interp)
    return out[..., None] if arr.ndim == 3 and out.ndim == 2 else out


class ProbeDataset(Dataset):
    """Common parts: ``with_image`` switch and the display image of an item."""

    with_image: bool = True

    def display_image(self, i: int) -> np.ndarray:
        """(H, W, 3) uint8 of item ``i`` as the probe sees it (for overlays)."""
        raise NotImplementedError

    def image_list(self) -> list[str]:
        """What decides the network input of each item, in item order (feature-cache keys)."""
        raise NotImplementedError

    def signature(self) -> str:
        """Digest of ``image_list`` and the image size: equal signatures see equal inputs
        (given equal image files), so their frozen features can be shared."""
        text = json.dumps([list(self.image_size), self.image_list()])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- COCO keypoints


class CocoKeypointDataset(ProbeDataset):
    """Top-down crops: ``image``, ``heatmaps`` (K, H/4, W/4), ``weights`` (K,), ``affine``
    (2, 3) image-to-crop, ``image_id``, ``box_score``."""

    def __init__(
        self,
        images_dir: str | Path,
        annotations: str | Path,
        *,
        image_size: tuple[int, int],
        heatmap_sigma: float = 2.0,
        box_padding: float = 1.25,
        sigmas: list[float] | None = None,
        person_boxes: str | Path | None = None,
        box_score_threshold: float = 0.0,
        max_samples: int = 0,
    ) -> None:
        self.images_dir = Path(images_dir)
        self.coco = load_coco_keypoints(annotations, sigmas)
        self.image_size = tuple(image_size)
        self.heatmap_size = (self.image_size[0] // 4, self.image_size[1] // 4)
        self.sigma, self.padding = heatmap_sigma, box_padding
        files = {img["id"]: img["file_name"] for img in self.coco.gt["images"]}
        if person_boxes:
            self.instances = detector_instances(person_boxes, files, self.coco.category_id, box_score_threshold)
        else:
            self.instances = [
                PersonInstance(
                    a["image_id"],
                    files[a["image_id"]],
                    a["bbox"],
                    1.0,
                    np.asarray(a["keypoints"], dtype=np.float64).reshape(-1, 3),
                )
                for a in self.coco.gt["annotations"]
                if not a["iscrowd"] and a["num_keypoints"] > 0
            ]
        if max_samples:
            self.instances = self.instances[:max_samples]
        if not self.instances:
            raise ValueError(f"{annotations}: no person instances with labelled keypoints")

    def __len__(self) -> int:
        return len(self.instances)

    def image_list(self) -> list[str]:
        return [f"{inst.file_name}@{[round(v, 3) for v in inst.box]}x{self.padding}" for inst in self.instances]

    def _crop(self, inst: PersonInstance) -> tuple[np.ndarray, np.ndarray]:
        import cv2

        M = box_to_affine(inst.box, self.image_size, self.padding)
        rgb = read_rgb(self.images_dir / inst.file_name)
        crop = cv2.warpAffine(
            rgb,
            M,
            (self.image_size[1], self.image_size[0]),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=(0, 0, 0),
        )
        return crop, M

    def __getitem__(self, i: int) -> dict:
        inst = self.instances[i]
        M = box_to_affine(inst.box, self.image_size, self.padding)
        item = {"index": i, "affine": torch.from_numpy(M), "image_id": inst.image_id, "box_score": inst.score}
        if self.with_image:
            item["image"] = to_tensor(self._crop(inst)[0])
        K = self.coco.num_keypoints
        kps = inst.keypoints if inst.keypoints is not None else np.zeros((K, 3))
        target, weight = encode_heatmaps(
            apply_affine(M, kps[:, :2]), kps[:, 2] > 0, self.image_size, self.heatmap_size, self.sigma
        )
        item["heatmaps"], item["weights"] = torch.from_numpy(target), torch.from_numpy(weight)
        return item

    def display_image(self, i: int) -> np.ndarray:
        return self._crop(self.instances[i])[0]


# ---------------------------------------------------------------- segmentation


def _pair_by_stem(
    images_dir: str | Path, labels_dir: str | Path, suffixes: tuple[str, ...], what: str, max_samples: int = 0
) -> list[tuple[Path, Path]]:
    images = find_by_stem(images_dir, IMAGE_SUFFIXES)
    labels = find_by_stem(labels_dir, suffixes)
    missing = sorted(set(images) - set(labels))
    if missing:
        raise ValueError(
            f"{len(missing)} image(s) in {images_dir} have no {what} in {labels_dir} "
            f"(same file stem expected), e.g. {missing[:3]}"
        )
    if not images:
        raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {images_dir}")
    pairs = [(images[s], labels[s]) for s in sorted(images)]
    return pairs[:max_samples] if max_samples else pairs


def _read_same_size(
    image_path: Path, label_path: Path, label_hw: tuple[int, int], out_hw: tuple[int, int]
) -> np.ndarray:
    rgb = read_rgb(image_path)
    if rgb.shape[:2] != tuple(label_hw):
        raise ValueError(
            f"{image_path} is {rgb.shape[1]}x{rgb.shape[0]} but its label {label_path} is {label_hw[1]}x{label_hw[0]}"
        )
    return resize(rgb, out_hw)


class SegmentationDataset(ProbeDataset):
    """``image`` and ``labels`` (H, W) int64 class indices (``ignore_index`` kept)."""

    def __init__(
        self,
        images_dir: str | Path,
        masks_dir: str | Path,
        *,
        image_size: tuple[int, int],
        num_classes: int,
        ignore_index: int = 255,
        class_names: list[str] | None = None,
        max_samples: int = 0,
    ) -> None:
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(f"{len(class_names)} class names for {num_classes} classes")
        self.pairs = _pair_by_stem(images_dir, masks_dir, (".png",), "PNG mask", max_samples)
        self.image_size, self.num_classes, self.ignore_index = tuple(image_size), num_classes, ignore_index
        self.class_names = class_names or [f"class_{i}" for i in range(num_classes)]

    def __len__(self) -> int:
        return len(self.pairs)

    def image_list(self) -> list[str]:
        return [str(image) for image, _ in self.pairs]

    def __getitem__(self, i: int) -> dict:
        image_path, mask_path = self.pairs[i]
        labels = read_class_mask(mask_path)
        bad = (labels >= self.num_classes) & (labels != self.ignore_index) | (labels < 0)
        if bad.any():
            raise ValueError(
                f"{mask_path}: class indices {sorted(np.unique(labels[bad]).tolist())[:5]} outside "
                f"0..{self.num_classes - 1} (ignore_index {self.ignore_index}); check seg.num_classes"
            )
        resized = resize(labels.astype(np.int32), self.image_size, nearest=True)
        item = {"index": i, "labels": torch.from_numpy(resized.astype(np.int64))}
        if self.with_image:
            item["image"] = to_tensor(_read_same_size(image_path, mask_path, labels.shape, self.image_size))
        return item

    def display_image(self, i: int) -> np.ndarray:
        return resize(read_rgb(self.pairs[i][0]), self.image_size)

    def class_frequencies(self) -> np.ndarray:
        """Pixel share of every class over the set (for the CE class weights)."""
        counts = np.zeros(self.num_classes, dtype=np.float64)
        for _, mask_path in self.pairs:
            labels = read_class_mask(mask_path)
            counts += np.bincount(labels[(labels >= 0) & (labels < self.num_classes)], minlength=self.num_classes)
        return counts / max(counts.sum(), 1)


# ---------------------------------------------------------------- dense float maps


class DenseMapDataset(ProbeDataset):
    """``image``, ``target`` (3, H, W) float32 and ``mask`` (H, W) bool of valid pixels.

    Valid = the mask file's non-zero pixels (all, without a masks folder) where the target
    is finite, and for ``kind="normal"`` of non-zero length.

    ``kind="depth"`` (Sapiens v1): target (1, H, W) is the reference's relative depth
    (``evaluation.depth.relative_depth_target``) of a 1-channel depth map or a pointmap's Z,
    made at ``image_size``: per image min-max normalised over the valid pixels (0 nearest,
    1 farthest), -1 elsewhere; ``mask`` = the pixels that count (valid and target > eps).
    """

    def __init__(
        self,
        images_dir: str | Path,
        maps_dir: str | Path,
        masks_dir: str | Path | None = None,
        *,
        image_size: tuple[int, int],
        kind: str,
        max_samples: int = 0,
    ) -> None:
        self.pairs = _pair_by_stem(images_dir, maps_dir, FLOAT_MAP_SUFFIXES, f"{kind} map", max_samples)
        self.masks = None
        if masks_dir:
            masks = find_by_stem(masks_dir, IMAGE_SUFFIXES)
            missing = [p.stem for p, _ in self.pairs if p.stem not in masks]
            if missing:
                raise ValueError(f"{len(missing)} image(s) have no mask in {masks_dir}, e.g. {missing[:3]}")
            self.masks = [masks[p.stem] for p, _ in self.pairs]
        self.image_size, self.kind = tuple(image_size), kind

    def __len__(self) -> int:
        return len(self.pairs)

    def image_list(self) -> list[str]:
        return [str(image) for image, _ in self.pairs]

    def __getitem__(self, i: int) -> dict:
        image_path, map_path = self.pairs[i]
        target = read_float_map(map_path)
        if self.kind == "depth" and target.shape[2] in (1, 3):
            target = target[..., -1:]  # a depth map, or a pointmap's Z
        elif target.shape[2] != 3:
            raise ValueError(f"{map_path}: a {self.kind} map needs 3 channels, got {target.shape[2]}")
        valid = np.isfinite(target).all(axis=2)
        if self.masks is not None:
            mask = read_binary_mask(self.masks[i])
            if mask.shape != target.shape[:2]:
                raise ValueError(
                    f"{self.masks[i]} is {mask.shape[1]}x{mask.shape[0]} but {map_path.name} is "
                    f"{target.shape[1]}x{target.shape[0]}"
                )
            valid &= mask
        target = np.where(valid[..., None], target, 0.0).astype(np.float32)
        valid_hw = target.shape[:2]
        if self.kind == "normal":
            valid &= np.linalg.norm(target, axis=2) > 0.5
        target = resize(target, self.image_size, nearest=True)
        valid = resize(valid.astype(np.uint8), self.image_size, nearest=True).astype(bool)
        if self.kind == "depth":
            rel, valid = relative_depth_target(target[..., 0], valid)
            target = rel[..., None]
        item = {
            "index": i,
            "target": torch.from_numpy(target.transpose(2, 0, 1).copy()),
            "mask": torch.from_numpy(valid),
        }
        if self.with_image:
            item["image"] = to_tensor(_read_same_size(image_path, map_path, valid_hw, self.image_size))
        return item

    def display_image(self, i: int) -> np.ndarray:
        return resize(read_rgb(self.pairs[i][0]), self.image_size)


# ---------------------------------------------------------------- k-NN labels


class LabeledImageDataset(ProbeDataset):
    """``image`` and ``label`` (int) from class sub-folders or a ``path,label`` CSV."""

    def __init__(
        self,
        images_dir: str | Path,
        labels_csv: str | Path | None = None,
        *,
        image_size: tuple[int, int],
        classes: list[str] | None = None,
        max_samples: int = 0,
    ) -> None:
        root = Path(images_dir)
        if labels_csv:
            items = _read_label_csv(root, Path(labels_csv))
        else:
            if not root.is_dir():
                raise ValueError(f"folder {str(root)!r} does not exist")
            items = [
                (p, d.name)
                for d in sorted(root.iterdir())
                if d.is_dir()
                for p in sorted(d.iterdir())
                if p.suffix.lower() in IMAGE_SUFFIXES
            ]
            if not items:
                raise ValueError(f"{root}: no class sub-folders with images (or give a labels CSV)")
        self.classes = classes or sorted({label for _, label in items})
        unknown = sorted({label for _, label in items} - set(self.classes))
        if unknown:
            raise ValueError(f"labels {unknown[:5]} of {labels_csv or root} are not among the training classes")
        index = {c: n for n, c in enumerate(self.classes)}
        self.items = [(p, index[label]) for p, label in items]
        if max_samples:
            self.items = self.items[:max_samples]
        self.image_size = tuple(image_size)

    def __len__(self) -> int:
        return len(self.items)

    def image_list(self) -> list[str]:
        return [str(path) for path, _ in self.items]

    def __getitem__(self, i: int) -> dict:
        item = {"index": i, "label": self.items[i][1]}
        if self.with_image:
            item["image"] = to_tensor(self.display_image(i))
        return item

    def display_image(self, i: int) -> np.ndarray:
        return resize(read_rgb(self.items[i][0]), self.image_size)


def _read_label_csv(root: Path, path: Path) -> list[tuple[Path, str]]:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as err:
        raise ValueError(f"cannot read labels CSV {path}: {err}") from None
    if not rows or not {"path", "label"} <= set(rows[0]):
        raise ValueError(f"labels CSV {path} needs a header with 'path' and 'label' columns and at least one row")
    items = []
    for n, row in enumerate(rows, start=2):
        if not row["path"] or not row["label"]:
            raise ValueError(f"labels CSV {path}, line {n}: empty path or label")
        p = root / row["path"]
        if not p.is_file():
            raise ValueError(f"labels CSV {path}, line {n}: image {p} does not exist")
        items.append((p, row["label"]))
    return items
