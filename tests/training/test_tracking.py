"""Rank 0's MLflow logging: the reconstruction grid, and outages that must not stop training."""
import logging

import numpy as np
import torch

from models.pretrain_heads import normalized_pixel_targets
from training.augment import MEAN, STD
from training.tracking import MetricsLogger, reconstruction_grid


def test_reconstruction_grid_shows_input_masked_and_reconstruction_rows():
    torch.manual_seed(0)
    pixels = torch.rand(2, 3, 32, 48)
    images = (pixels - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    masks = torch.tensor([[True, False, False, True, False, True], [False] * 5 + [True]])
    perfect = normalized_pixel_targets(pixels, 16)
    sheet = np.asarray(reconstruction_grid({"images": images, "masks": masks, "preds": perfect}, 16))
    assert sheet.shape == (2 * 32, 3 * 48, 3)
    original, hidden, recon = sheet[:32, :48], sheet[:32, 48:96], sheet[:32, 96:]
    assert (hidden[:16, :16] == 128).all()  # patch 0 is masked: grey
    assert np.array_equal(hidden[:16, 16:32], original[:16, 16:32])  # patch 1 is visible
    # a perfect prediction, de-normalised with the true patch statistics, gives the input back
    assert np.abs(recon.astype(int) - original.astype(int)).max() <= 1


def test_an_unreachable_store_costs_a_warning_not_the_run(tmp_path, caplog):
    logger = MetricsLogger(f"sqlite:///{tmp_path}/missing/dir/mlflow.db", "no-such-run", flush_every=2)
    with caplog.at_level(logging.WARNING):
        logger.log(1, {"loss": 1.0})
        logger.log(2, {"loss": 0.5})  # flush attempt fails quietly
        logger.set_tag("checkpoint.latest", "x")
    assert len(logger.buffer) == 2  # kept for the next attempt
    assert "training goes on" in caplog.text
