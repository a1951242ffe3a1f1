"""Reading probe data from disk: RGB images, PNG class-index masks, float maps, digests.

Float maps: ``.npy`` (H x W or H x W x C float) always; ``.exr`` through OpenCV when its
build has OpenEXR (``OPENCV_IO_ENABLE_OPENEXR=1`` is set before ``cv2`` is imported). The
``opencv-python`` 5.0 wheel this project pins is built without OpenEXR, so with it ``.exr``
files are refused with a message saying so (convert them to ``.npy``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from PIL import Image

from infra.digests import sha256_file

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")
FLOAT_MAP_SUFFIXES = (".npy", ".exr")


def read_rgb(path: str | Path) -> np.ndarray:
    """(H, W, 3) uint8 RGB; grey, palette and RGBA images are converted (alpha dropped)."""
    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read image {path}: {err}") from None


def read_class_mask(path: str | Path) -> np.ndarray:
    """(H, W) int64 class indices from a single-channel (L, P, I;16 or I) PNG.

    An RGB(A) PNG is refused: colour-coded masks need a palette-to-index mapping first.
    """
    try:
        with Image.open(path) as im:
            if im.mode not in ("L", "P", "I", "I;16", "I;16B", "1"):
                raise ValueError(
                    f"mode {im.mode}: a class-index mask must be single-channel (L, P or 16-bit); "
                    "convert colour-coded masks to class indices first"
                )
            return np.asarray(im).astype(np.int64)
    except OSError as err:
        raise ValueError(f"cannot read mask {path}: {err}") from None


def read_binary_mask(path: str | Path) -> np.ndarray:
    """(H, W) bool, non-zero = True (any channel of a colour image)."""
    try:
        with Image.open(path) as im:
            arr = np.asarray(im)
    except OSError as err:
        raise ValueError(f"cannot read mask {path}: {err}") from None
    return arr.any(axis=-1) if arr.ndim == 3 else arr != 0


def read_float_map(path: str | Path) -> np.ndarray:
    """(H, W, C) float32 from ``.npy`` or ``.exr`` (C = 1 for single-channel maps)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read float map {path}: {err}") from None
    elif suffix == ".exr":
        arr = _read_exr(path)
    else:
        raise ValueError(f"unknown float map format {suffix!r} for {path}; use .npy or .exr")
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{path}: expected an H x W x C float map, got shape {arr.shape} dtype {arr.dtype}")
    return arr.astype(np.float32, copy=False)


def _read_exr(path: Path) -> np.ndarray:
    os.environ.setdefault("OPENCV_IO_ENABLE_OPENEXR", "1")
    import cv2

    if not cv2.haveImageReader(str(path)):
        raise ValueError(
            f"cannot read {path}: this OpenCV build has no OpenEXR support "
            "(cv2.getBuildInformation() shows 'OpenEXR: NO'); convert the maps to .npy"
        )
    arr = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if arr is None:
        raise ValueError(f"cannot read EXR {path}")
    # OpenCV gives BGR channel order; maps are stored RGB / XYZ.
    return arr[..., 2::-1].copy() if arr.ndim == 3 and arr.shape[2] >= 3 else arr


def find_by_stem(folder: str | Path, suffixes: tuple[str, ...]) -> dict[str, Path]:
    """``{stem: path}`` of the files in ``folder`` (not recursive) with one of ``suffixes``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"folder {str(folder)!r} does not exist")
    found: dict[str, Path] = {}
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.suffix.lower() in suffixes and not p.name.startswith("."):
            if p.stem in found:
                raise ValueError(f"two files share the stem {p.stem!r} in {folder}: {found[p.stem].name}, {p.name}")
            found[p.stem] = p
    return found


def path_digest(path: str | Path, length: int = 16) -> str:
    """Version of a data path: a file's content hash, or for a folder a hash of its listing
    (relative names and sizes, recursively: cheap on large image folders). "" for ""."""
    if not path:
        return ""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)[:length]
    if not path.is_dir():
        raise ValueError(f"data path {str(path)!r} does not exist")
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(f"{p.relative_to(path).as_posix()}\t{p.stat().st_size}\n".encode())
    return h.hexdigest()[:length]
