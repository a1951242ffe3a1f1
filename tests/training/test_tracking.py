"""Rank 0's MLflow logging: the reconstruction grid, and outages that must not stop training."""

import logging

import numpy as np
import torch

from infra.tracking import MetricsLogger
from models.pretrain_heads import normalized_pixel_targets
from training.augment import MEAN, STD
from training.visualize import reconstruction_grid


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
    assert "training goes on" in caplog.text and "could not be opened" in caplog.text


def test_values_past_the_buffer_are_dropped_with_a_warning_and_their_count(tmp_path, caplog):
    logger = MetricsLogger(f"sqlite:///{tmp_path}/missing/dir/mlflow.db", "no-such-run", flush_every=100, max_buffer=3)
    with caplog.at_level(logging.WARNING, logger="infra.tracking"):
        for step in range(1, 6):
            logger.log(step, {"loss": 1.0 / step})
    assert [v for _, v, _, _ in logger.buffer] == [1 / 3, 1 / 4, 1 / 5] and logger.dropped == 2
    assert caplog.text.count("metrics buffer full (max_buffer=3 values)") == 1  # then at most once a minute
    assert "1 in all so far" in caplog.text


def test_a_run_records_how_many_values_were_dropped_once_a_flush_goes_through(tmp_path):
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    run_id = MlflowClient(uri).create_run(MlflowClient(uri).create_experiment("drops")).info.run_id
    logger = MetricsLogger(uri, run_id, flush_every=4, max_buffer=2)
    for step in range(1, 5):  # steps 1 and 2 are dropped before the flush at step 4
        logger.log(step, {"loss": float(step)})
    run = MlflowClient(uri).get_run(run_id)
    assert [m.step for m in MlflowClient(uri).get_metric_history(run_id, "loss")] == [3, 4]
    assert run.data.tags[MetricsLogger.DROPPED_TAG] == "2" and not logger.buffer


def test_loss_trend_averages_the_first_and_last_windows_of_each_loss():
    from training.run import TrainingResult

    history = {s: {"loss": float(10 - s), "loss_mae": 1.0, "lr": 0.1} for s in range(1, 9)}
    history[9] = {"lr": 0.1}  # a step with no loss logged does not count
    result = TrainingResult(
        run_name="r",
        run_dir="d",
        checkpoint_uri=None,
        student_weights=None,
        teacher_weights=None,
        checkpoint_digest="",
        final_step=9,
        completed=True,
        losses=[],
        mlflow_run_id="m",
        tracking_uri="t",
        dataset_id="x",
        dataset_uri="u",
        config_digest="c",
        seconds=0.0,
        history=history,
    )
    trend = result.loss_trend(window=3)
    assert trend["loss"] == (8.0, 3.0, 3)  # mean(9, 8, 7) -> mean(4, 3, 2)
    assert trend["loss_mae"] == (1.0, 1.0, 3) and "lr" not in trend and "loss_cl" not in trend
    assert result.loss_trend(window=10)["loss"] == (7.5, 3.5, 4)  # the window shrinks to half the steps
    assert "mean of the first 3 steps" not in result.summary() and "(last 4)" in result.summary()
