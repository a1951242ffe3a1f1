"""The Sapiens2 processing reference vectors (``shared/reference/sapiens2_processing_parity.safetensors``,
described in ``sapiens2_processing_reference.md``) for the parity tests: the cases of each task
from the file's own keys, the tensors (remembering which a test read) and the stand-in network
outputs rebuilt as the reference page's §2 says."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file

FILE = "sapiens2_processing_parity.safetensors"
TASKS = ("pose", "seg", "normal", "pointmap", "albedo")


def reference_file() -> Path:
    repo = Path(__file__).resolve().parents[2]
    for folder in (
        os.environ.get("SAPIENS2_REFERENCE_DIR"),
        repo / "shared/reference",
        repo.parent / "shared/reference",
    ):
        if folder and (Path(folder) / FILE).is_file():
            return Path(folder) / FILE
    raise FileNotFoundError(f"{FILE} not found in shared/reference; set SAPIENS2_REFERENCE_DIR")


def _cases() -> dict[str, list[str]]:
    """task -> its cases (``<task>/<case>/...``; the dense model outputs are not cases)."""
    with safe_open(reference_file(), "np") as f:
        keys = list(f.keys())
    return {
        t: sorted(
            {k.split("/")[1] for k in keys if k.startswith(f"{t}/") and not k.split("/")[1].startswith("model_output_")}
        )
        for t in TASKS
    }


CASES = _cases()


class Reference:
    """The file's tensors and ``meta``, remembering which tensors were read."""

    def __init__(self, tensors: dict[str, np.ndarray], meta: dict) -> None:
        self.tensors, self.meta, self.read = tensors, meta, set()

    @classmethod
    def load(cls) -> Reference:
        path = reference_file()
        with safe_open(path, "np") as f:
            meta = json.loads(f.metadata()["meta"])
        return cls(load_file(path), meta)

    def fresh(self) -> Reference:
        """The same tensors with nothing read yet."""
        return Reference(self.tensors, self.meta)

    def __getitem__(self, key: str) -> np.ndarray:
        self.read.add(key)
        return self.tensors[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def unread(self, prefix: str) -> list[str]:
        return sorted(k for k in self.tensors if k.startswith(prefix) and k not in self.read)

    def image(self, task: str, case: str) -> np.ndarray:
        """The case's input image, BGR uint8 (H, W, 3)."""
        return self[f"input/{self.meta[task]['cases'][case]['image']}/image_bgr_u8"]

    def heatmaps(self, prefix: str, p: int, hw: tuple[int, int]) -> torch.Tensor:
        """Pass ``p``'s stand-in pose network output (K, h, w): each channel its background
        value, then its patch pasted at its offset."""
        background = self[f"{prefix}/heatmaps_pass{p}_background"]
        patches, offsets = self[f"{prefix}/heatmaps_pass{p}_patches"], self[f"{prefix}/heatmaps_pass{p}_offsets"]
        size = patches.shape[-1]
        out = np.empty((len(background), *hw), dtype=np.float32)
        for k, (value, patch, (y, x)) in enumerate(zip(background, patches, offsets)):
            out[k] = value
            out[k, y : y + size, x : x + size] = patch
        return torch.from_numpy(out)

    def dense_output(self, task: str, geometry: str) -> torch.Tensor:
        """The fixed (1, C, H, W) dense network output, C-contiguous:
        ``coarse[c, y // B, x // B] + fine[c, y % P, x % P]``, checked against its checksum."""
        prefix = f"{task}/model_output_{geometry}"
        _, B, P = self.meta["dense"]["generator_params"][f"{task}/{geometry}"]
        coarse, fine = self[f"{prefix}/coarse"], self[f"{prefix}/fine"]
        H, W = geometry_hw(geometry)
        ys, xs = np.arange(H), np.arange(W)
        out = coarse[:, ys // B][:, :, xs // B] + fine[:, ys % P][:, :, xs % P]
        np.testing.assert_allclose(out.sum(axis=(1, 2), dtype=np.float64), self[f"{prefix}/full_sum"], rtol=1e-9)
        return torch.from_numpy(np.ascontiguousarray(out[None], dtype=np.float32))


def geometry_hw(case_or_geometry: str) -> tuple[int, int]:
    """(H, W) of a case ``<name>_<H>x<W>`` or a geometry ``<H>x<W>``."""
    h, w = re.search(r"(\d+)x(\d+)$", case_or_geometry).groups()
    return int(h), int(w)


def geometry_of(case: str) -> str:
    return case.rsplit("_", 1)[1]
