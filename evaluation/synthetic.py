"""A small synthetic probe set, rendered at run time, written in the real data formats.

Each image shows one stick figure facing the camera (a sphere head, capsule torso and
limbs) over a noisy gradient background with distractor shapes. Because the figure is made
of analytic shapes, every label is exact:

- COCO-17 keypoints (``person_keypoints.json``; the person's left is on the image's right),
- part masks (``seg/*.png``): background, head, torso, left/right arm, left/right leg,
- per-pixel normals (``normal/*.npy``, camera frame x right, y down, z forward: visible
  surfaces have n_z < 0), albedo (``albedo/*.npy``, the flat part colours before shading),
  pointmaps (``pointmap/*.npy``, metres, pinhole camera with ``FOCAL_PX``), and the human
  mask (``masks/*.png``) that marks their valid pixels,
- a pose category per image for k-NN (``labels.csv``: arms down, arms up, T-pose, star).

The figure is about 1.7 m tall, so its size in pixels fixes its depth (pointmaps are
learnable). The image is ``albedo * (ambient + diffuse * max(0, n.l))`` with a random light.
Layout under ``root``: ``{train,val}/{images,seg,normal,albedo,pointmap,masks}/<id>.*``,
``{train,val}/person_keypoints.json``, ``{train,val}/labels.csv`` and ``meta.json``.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from evaluation.config import SplitPaths
from models.vocab import keypoint_vocab, seg_vocab

FORMAT_VERSION = 1
FOCAL_PX = 110.0
PERSON_HEIGHT_M = 1.7
PART_CLASSES = seg_vocab("seg_synthetic_7").classes
POSE_CATEGORIES = ("arms_down", "arms_up", "t_pose", "star")
COCO17_KEYPOINTS = keypoint_vocab("coco_17").keypoint_names
COCO17_SKELETON = tuple((a + 1, b + 1) for a, b in keypoint_vocab("coco_17").skeleton)  # 1-based, as in COCO

# Limb angles in degrees away from straight down, outwards: (upper arm, forearm, thigh, shin).
_CATEGORY_ANGLES = {
    "arms_down": (12, 8, 5, 0),
    "arms_up": (150, 165, 5, 0),
    "t_pose": (90, 90, 8, 2),
    "star": (45, 40, 28, 25),
}


@dataclass(frozen=True)
class _Capsule:
    a: np.ndarray  # segment end points (x, y) in pixels
    b: np.ndarray
    radius: float  # pixels
    part: int  # PART_CLASSES index
    colour: np.ndarray  # albedo RGB in [0, 1]
    depth_offset: float  # metres added to the figure's depth (negative = nearer)


def _limb(start: np.ndarray, angle_deg: float, length: float, side: int) -> np.ndarray:
    """End point of a limb hanging ``angle_deg`` outwards from straight down; side +1 = image right."""
    a = math.radians(angle_deg)
    return start + np.array([side * math.sin(a) * length, math.cos(a) * length])


def _figure(rng: np.random.Generator, category: str, hw: tuple[int, int]):
    """Keypoints (17, 2), capsules, and the figure's depth for one random figure, placed at
    a random position where it fits (centred where it does not)."""
    H, W = hw
    height = rng.uniform(0.55, 0.85) * H
    kp, r_head = _skeleton(rng, category, height)
    kp = _placed(rng, kp, height, hw)
    caps = _capsules(rng, kp, r_head, height)
    depth = FOCAL_PX * PERSON_HEIGHT_M * rng.uniform(0.95, 1.05) / height
    return np.stack([kp[n] for n in COCO17_KEYPOINTS]), caps, depth


def _skeleton(rng: np.random.Generator, category: str, height: float) -> tuple[dict, float]:
    """Keypoints in the figure's frame (head top at 0) for the category's limb angles with
    per-limb variation, and the head's radius."""
    u_arm, l_arm, u_leg, l_leg = (a + rng.normal(0, 7) for a in _CATEGORY_ANGLES[category])
    jitter = lambda: rng.normal(0, 6)  # noqa: E731 - per-limb variation around the category
    p = lambda fx, fy: np.array([fx * height, fy * height])  # noqa: E731 - figure frame, head top at 0

    head_c, r_head = p(0, 0.075), 0.07 * height
    kp = {
        "nose": head_c + [0, 0.2 * r_head],
        "left_eye": head_c + [0.35 * r_head, -0.15 * r_head],
        "right_eye": head_c + [-0.35 * r_head, -0.15 * r_head],
        "left_ear": head_c + [0.9 * r_head, 0.05 * r_head],
        "right_ear": head_c + [-0.9 * r_head, 0.05 * r_head],
        "head": head_c,
        "neck": p(0, 0.25),
        "pelvis": p(0, 0.44),
    }
    for side, name in ((1, "left"), (-1, "right")):
        sh = p(side * 0.1, 0.21)
        el = _limb(sh, u_arm + jitter(), 0.16 * height, side)
        wr = _limb(el, l_arm + jitter(), 0.15 * height, side)
        hip = p(side * 0.055, 0.5)
        kn = _limb(hip, u_leg + jitter(), 0.24 * height, side)
        an = _limb(kn, l_leg + jitter(), 0.23 * height, side)
        kp.update(
            {
                f"{name}_shoulder": sh,
                f"{name}_elbow": el,
                f"{name}_wrist": wr,
                f"{name}_hip": hip,
                f"{name}_knee": kn,
                f"{name}_ankle": an,
            }
        )
    return kp, r_head


def _placed(rng: np.random.Generator, kp: dict, height: float, hw: tuple[int, int]) -> dict:
    """The keypoints tilted a little and shifted to a random place in the image where they fit."""
    H, W = hw
    tilt = math.radians(rng.normal(0, 5))
    rot = np.array([[math.cos(tilt), -math.sin(tilt)], [math.sin(tilt), math.cos(tilt)]])
    pts = {k: rot @ v for k, v in kp.items()}
    allp = np.stack(list(pts.values()))
    lo, hi = allp.min(axis=0) - 0.1 * height, allp.max(axis=0) + 0.1 * height  # limb radii and margin
    shift = np.array([_place(rng, lo[0], hi[0], W), _place(rng, lo[1], hi[1], H)])
    return {k: v + shift for k, v in pts.items()}


def _capsules(rng: np.random.Generator, kp: dict, r_head: float, height: float) -> list:
    """Head, torso and limbs as capsules with random skin and clothing colours."""
    skin = _random_colour(rng, hue=(0.02, 0.1), sat=(0.3, 0.6), val=(0.55, 0.95))
    shirt, trousers = _random_colour(rng), _random_colour(rng)
    arm_depth = -0.06  # metres: arms in front of the torso where they cross it
    caps = [
        _Capsule(kp["head"], kp["head"], r_head, 1, skin, 0.0),
        _Capsule(kp["neck"], kp["pelvis"], 0.1 * height, 2, shirt, 0.0),
    ]
    for side, arm_cls, leg_cls in (("left", 3, 5), ("right", 4, 6)):
        caps += [
            _Capsule(kp[f"{side}_shoulder"], kp[f"{side}_elbow"], 0.035 * height, arm_cls, shirt, arm_depth),
            _Capsule(kp[f"{side}_elbow"], kp[f"{side}_wrist"], 0.03 * height, arm_cls, skin, arm_depth),
            _Capsule(kp[f"{side}_hip"], kp[f"{side}_knee"], 0.05 * height, leg_cls, trousers, 0.0),
            _Capsule(kp[f"{side}_knee"], kp[f"{side}_ankle"], 0.04 * height, leg_cls, trousers, 0.01),
        ]
    return caps


def _place(rng: np.random.Generator, lo: float, hi: float, size: int) -> float:
    """A shift putting [lo, hi] inside [0, size - 1] at random, or centring it if too long."""
    slack = (size - 1) - (hi - lo)
    return -lo + (rng.uniform(0, slack) if slack > 0 else slack / 2)


def _random_colour(rng: np.random.Generator, hue=(0.0, 1.0), sat=(0.35, 0.9), val=(0.35, 0.95)) -> np.ndarray:
    import colorsys

    return np.array(colorsys.hsv_to_rgb(rng.uniform(*hue), rng.uniform(*sat), rng.uniform(*val)))


def _render(caps: list[_Capsule], depth: float, hw: tuple[int, int]):
    """Z-buffered part labels, normals, albedo and depth of the capsules."""
    H, W = hw
    zbuf = np.full((H, W), np.inf)
    part = np.zeros((H, W), np.uint8)
    normal = np.zeros((H, W, 3))
    albedo = np.zeros((H, W, 3))
    for c in caps:
        # Only the capsule's bounding box can be inside it.
        x0, y0 = np.floor(np.minimum(c.a, c.b) - c.radius).astype(int).clip(0, [W, H])
        x1, y1 = np.ceil(np.maximum(c.a, c.b) + c.radius + 1).astype(int).clip(0, [W, H])
        if x0 >= x1 or y0 >= y1:
            continue
        ys, xs = np.mgrid[y0:y1, x0:x1].astype(np.float64)
        pix = np.stack([xs, ys], axis=-1)
        ab = c.b - c.a
        t = np.clip(((pix - c.a) @ ab) / max(float(ab @ ab), 1e-9), 0.0, 1.0)
        offset = pix - (c.a + t[..., None] * ab)
        rho = np.linalg.norm(offset, axis=-1) / c.radius  # distance to the axis, in radii
        bulge = np.sqrt(np.clip(1 - rho**2, 0, 1))
        z = depth + c.depth_offset - bulge * c.radius * depth / FOCAL_PX
        win = (rho < 1.0) & (z < zbuf[y0:y1, x0:x1])
        n = np.concatenate([offset / c.radius, -bulge[..., None]], axis=-1)
        zbuf[y0:y1, x0:x1][win] = z[win]
        part[y0:y1, x0:x1][win] = c.part
        normal[y0:y1, x0:x1][win] = n[win] / np.linalg.norm(n[win], axis=-1, keepdims=True)
        albedo[y0:y1, x0:x1][win] = c.colour
    return part, normal, albedo, zbuf


def _background(rng: np.random.Generator, hw: tuple[int, int]) -> np.ndarray:
    import cv2

    H, W = hw
    c0, c1 = _random_colour(rng, sat=(0.0, 0.6)), _random_colour(rng, sat=(0.0, 0.6))
    a = rng.uniform(0, 2 * math.pi)
    ys, xs = np.mgrid[0:H, 0:W]
    t = ((xs / W - 0.5) * math.cos(a) + (ys / H - 0.5) * math.sin(a) + 0.75) / 1.5
    bg = (c0 * (1 - t[..., None]) + c1 * t[..., None]) * 255
    for _ in range(rng.integers(0, 4)):
        colour = tuple(float(v) for v in _random_colour(rng) * 255)
        centre = (int(rng.integers(0, W)), int(rng.integers(0, H)))
        if rng.random() < 0.5:
            axes = (int(rng.integers(4, W // 4)), int(rng.integers(4, H // 4)))
            cv2.ellipse(bg, centre, axes, float(rng.uniform(0, 180)), 0, 360, colour, -1)
        else:
            size = (int(rng.integers(6, W // 3)), int(rng.integers(6, H // 3)))
            cv2.rectangle(bg, centre, (centre[0] + size[0], centre[1] + size[1]), colour, -1)
    return bg


def render_sample(rng: np.random.Generator, hw: tuple[int, int]) -> dict:
    """One image with all its labels (see the module docstring)."""
    H, W = hw
    cat_id = int(rng.integers(len(POSE_CATEGORIES)))
    keypoints, caps, depth = _figure(rng, POSE_CATEGORIES[cat_id], hw)
    part, normal, albedo, z = _render(caps, depth, hw)
    mask = part > 0
    light = np.array([rng.uniform(-0.6, 0.6), rng.uniform(-0.8, 0.2), -1.0])
    light /= np.linalg.norm(light)
    shading = 0.3 + 0.7 * np.clip(normal @ light, 0, None)  # light: unit vector towards the light
    image = _background(rng, hw)
    image[mask] = (albedo * shading[..., None] * 255)[mask]
    image = np.clip(image + rng.normal(0, 4, image.shape), 0, 255).astype(np.uint8)
    ys, xs = np.mgrid[0:H, 0:W]
    pointmap = np.zeros((H, W, 3))
    zm = z[mask]
    pointmap[mask] = np.stack(
        [(xs[mask] - (W - 1) / 2) * zm / FOCAL_PX, (ys[mask] - (H - 1) / 2) * zm / FOCAL_PX, zm], axis=-1
    )
    inside = (keypoints[:, 0] >= 0) & (keypoints[:, 0] <= W - 1) & (keypoints[:, 1] >= 0) & (keypoints[:, 1] <= H - 1)
    return {
        "image": image,
        "seg": part,
        "normal": normal.astype(np.float32),
        "albedo": albedo.astype(np.float32),
        "pointmap": pointmap.astype(np.float32),
        "mask": mask,
        "keypoints": keypoints,
        "visible": inside,
        "category": cat_id,
    }


def generate_synthetic_set(
    root: str | Path, *, train_images: int = 160, val_images: int = 48, hw: tuple[int, int] = (128, 96), seed: int = 0
) -> Path:
    """Write the set under ``root`` (skipped when ``meta.json`` already records the same
    settings); returns ``root``."""
    root = Path(root)
    meta = {
        "format_version": FORMAT_VERSION,
        "train_images": train_images,
        "val_images": val_images,
        "height": hw[0],
        "width": hw[1],
        "seed": seed,
        "focal_px": FOCAL_PX,
        "part_classes": list(PART_CLASSES),
        "pose_categories": list(POSE_CATEGORIES),
        "keypoints": list(COCO17_KEYPOINTS),
    }
    meta_path = root / "meta.json"
    if meta_path.is_file() and json.loads(meta_path.read_text()) == meta:
        return root
    for split, count in (("train", train_images), ("val", val_images)):
        _write_split(root / split, split, count, hw, seed)
    meta_path.write_text(json.dumps(meta, indent=1))  # written last: the set is complete
    return root


def _save_sample(out: Path, name: str, s: dict) -> None:
    """One sample's image, part mask, human mask and dense labels under ``out``."""
    Image.fromarray(s["image"]).save(out / "images" / f"{name}.png")
    Image.fromarray(s["seg"]).save(out / "seg" / f"{name}.png")
    Image.fromarray((s["mask"] * 255).astype(np.uint8)).save(out / "masks" / f"{name}.png")
    for key in ("normal", "albedo", "pointmap"):
        np.save(out / key / f"{name}.npy", s[key])


def _coco_annotation(i: int, s: dict) -> dict:
    """The COCO person annotation of sample ``i`` (ids from 1): box and area of its mask, keypoints."""
    ys, xs = np.nonzero(s["mask"])
    kps = [[float(x), float(y), 2] if v else [0.0, 0.0, 0] for (x, y), v in zip(s["keypoints"], s["visible"])]
    return {
        "id": i + 1,
        "image_id": i + 1,
        "category_id": 1,
        "iscrowd": 0,
        "bbox": [
            float(xs.min()),
            float(ys.min()),
            float(xs.max() - xs.min() + 1),
            float(ys.max() - ys.min() + 1),
        ],
        "area": float(s["mask"].sum()),
        "keypoints": [v for k in kps for v in k],
        "num_keypoints": int(s["visible"].sum()),
    }


def _write_labels(out: Path, images: list[dict], annotations: list[dict], rows: list[tuple[str, str]]) -> None:
    """``person_keypoints.json`` (COCO) and ``labels.csv`` (pose category per image)."""
    coco = {
        "images": images,
        "annotations": annotations,
        "categories": [
            {
                "id": 1,
                "name": "person",
                "supercategory": "person",
                "keypoints": list(COCO17_KEYPOINTS),
                "skeleton": [list(e) for e in COCO17_SKELETON],
            }
        ],
    }
    (out / "person_keypoints.json").write_text(json.dumps(coco))
    with open(out / "labels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label"])
        writer.writerows(rows)


def _write_split(out: Path, split: str, count: int, hw: tuple[int, int], seed: int) -> None:
    for sub in ("images", "seg", "normal", "albedo", "pointmap", "masks"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    images, annotations, rows = [], [], []
    for i in range(count):
        s = render_sample(np.random.default_rng([seed, 0 if split == "train" else 1, i]), hw)
        name = f"{i:06d}"
        _save_sample(out, name, s)
        images.append({"id": i + 1, "file_name": f"{name}.png", "height": hw[0], "width": hw[1]})
        annotations.append(_coco_annotation(i, s))
        rows.append((f"{name}.png", POSE_CATEGORIES[s["category"]]))
    _write_labels(out, images, annotations, rows)


def split_paths(root: str | Path, task: str, split: str) -> SplitPaths:
    """Where ``task``'s ``split`` lives in a set written by ``generate_synthetic_set``."""
    base = Path(root) / split
    images = str(base / "images")
    if task == "pose":
        return SplitPaths(images=images, labels=str(base / "person_keypoints.json"))
    if task == "seg":
        return SplitPaths(images=images, labels=str(base / "seg"))
    if task == "knn":
        return SplitPaths(images=images, labels=str(base / "labels.csv"))
    return SplitPaths(images=images, labels=str(base / task), masks=str(base / "masks"))
