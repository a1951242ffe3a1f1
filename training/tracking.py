"""MLflow from the training workers: rank 0 logs every step's values in batches, the
MAE reconstruction grid as an image, and the latest checkpoint's URI.

Logging must never cost a training run: a failed flush is logged as a warning and its
metrics stay buffered (up to ``max_buffer``) for the next attempt.
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch
from PIL import Image

from models.pretrain_heads import patchify, unpatchify
from training.augment import MEAN, STD

log = logging.getLogger(__name__)


class MetricsLogger:
    """Importing MLflow and opening its store take seconds: that happens in a background
    thread while the model is built and the first batch decoded."""

    def __init__(self, tracking_uri: str, run_id: str, *, flush_every: int, max_buffer: int = 200_000) -> None:
        self.run_id, self.flush_every, self.max_buffer = run_id, flush_every, max_buffer
        self.buffer: list[tuple[str, float, int, int]] = []
        self._last_warning = 0.0
        self._client = None
        self._tracking_uri, self._open_error, self._last_open = tracking_uri, None, 0.0
        self._connect = threading.Thread(target=self._open, daemon=True)
        self._connect.start()

    def _open(self) -> None:
        """Open the store (SQLite schema checks, the run exists); a failure is kept, not raised."""
        self._last_open = time.monotonic()
        try:
            from mlflow import MlflowClient

            client = MlflowClient(self._tracking_uri)
            client.get_run(self.run_id)
            self._client, self._open_error = client, None
        except Exception as err:  # noqa: BLE001 - tracking outages must not stop training
            self._open_error = err

    @property
    def client(self):
        self._connect.join()
        if self._client is None and time.monotonic() - self._last_open > 60:
            self._open()  # a store that was down may be back; at most once a minute
        if self._client is None:
            raise RuntimeError(f"MLflow store {self._tracking_uri} could not be opened: {self._open_error}")
        return self._client

    def log(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.buffer.extend((key, float(v), now, step) for key, v in values.items() if v is not None)
        if len(self.buffer) > self.max_buffer:
            del self.buffer[: len(self.buffer) - self.max_buffer]
        if step % self.flush_every == 0:
            self.flush()

    def flush(self) -> None:
        while self.buffer:
            chunk = self.buffer[:1000]  # MLflow's log_batch limit
            if not self._guard("log metrics", lambda: self._log_batch(chunk)):
                return
            del self.buffer[: len(chunk)]

    def _log_batch(self, chunk) -> None:
        client = self.client  # first: waits for the background import of mlflow to finish
        from mlflow.entities import Metric

        client.log_batch(self.run_id, metrics=[Metric(k, v, ts, step) for k, v, ts, step in chunk])

    def log_image(self, image: Image.Image, artifact_file: str) -> None:
        self._guard("log an image", lambda: self.client.log_image(self.run_id, image, artifact_file=artifact_file))

    def set_tag(self, key: str, value: str) -> None:
        self._guard("set a tag", lambda: self.client.set_tag(self.run_id, key, value))

    def _guard(self, what: str, fn) -> bool:
        try:
            fn()
            return True
        except Exception as err:  # noqa: BLE001 - tracking outages must not stop training
            if time.monotonic() - self._last_warning > 60:
                log.warning("MLflow: could not %s (%s); training goes on, will retry", what, err)
                self._last_warning = time.monotonic()
            return False


def reconstruction_grid(viz: dict[str, torch.Tensor], stride: int, *, scale: int = 1) -> Image.Image:
    """One row per sample: input | masked input | reconstruction.

    The decoder predicts per-patch normalised pixels; each masked patch is shown
    de-normalised with the mean and std of the true patch (as in the MAE paper's
    figures); visible patches are shown as they were. ``viz``: ``images`` (N, 3, H, W)
    normalised, ``masks`` (N, P) True = masked, ``preds`` (N, P, X).
    """
    images, masks, preds = viz["images"], viz["masks"], viz["preds"]
    _, _, H, W = images.shape
    grid = (H // stride, W // stride)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    pixels = (images * std + mean).clamp(0, 1)
    patches_NPX = patchify(pixels, stride)
    mu = patches_NPX.mean(-1, keepdim=True)
    sigma = (patches_NPX.var(-1, keepdim=True, unbiased=False) + 1e-6).sqrt()
    masked = masks[..., None]
    recon_NPX = torch.where(masked, preds * sigma + mu, patches_NPX).clamp(0, 1)
    hidden_NPX = torch.where(masked, torch.full_like(patches_NPX, 0.5), patches_NPX)
    rows = torch.cat([pixels, unpatchify(hidden_NPX, stride, grid), unpatchify(recon_NPX, stride, grid)], dim=3)
    sheet = torch.cat(list(rows), dim=1)  # (3, N*H, 3W)
    array = (sheet.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    out = Image.fromarray(array)
    if scale > 1:
        out = out.resize((out.width * scale, out.height * scale), Image.Resampling.NEAREST)
    return out
