"""Checkpoint lineage: digest, and the pretraining run found by id or by digest."""

from __future__ import annotations

import hashlib

import pytest

from evaluation.lineage import RANDOM_INIT, digest_matches, resolve_lineage


@pytest.fixture()
def store(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    return uri


def _pretrain_run(uri: str, digest: str, dataset_id: str = "humans-v3") -> str:
    import mlflow

    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment(f"pretraining-{dataset_id}")
    with mlflow.start_run(
        experiment_id=exp,
        tags={
            "humanvision.stage": "pretrain",
            "checkpoint.digest": digest,
            "dataset.id": dataset_id,
            "dataset.uri": f"s3://b/{dataset_id}/",
        },
    ) as run:
        return run.info.run_id


def test_digest_matching_rules():
    full = hashlib.sha256(b"x").hexdigest()
    assert digest_matches(full, full) and digest_matches(f"sha256:{full.upper()}", full)
    assert digest_matches(full[:12], full) and not digest_matches(full[:11], full)  # too short to trust
    assert not digest_matches("0" * 64, full)


def test_random_init_is_recorded_as_such():
    lin = resolve_lineage("", seed=4)
    assert lin.tags()["lineage.checkpoint_path"] == RANDOM_INIT
    assert lin.tags()["lineage.checkpoint_digest"] == "random-init:seed=4"
    with pytest.raises(ValueError, match="pretrain_run_id is set but backbone.checkpoint is empty"):
        resolve_lineage("", seed=0, pretrain_run_id="abc")


def test_missing_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        resolve_lineage(str(tmp_path / "nope.safetensors"), seed=0)


def test_found_by_digest_and_by_id(tmp_path, store):
    ckpt = tmp_path / "student.safetensors"
    ckpt.write_bytes(b"weights")
    sha = hashlib.sha256(b"weights").hexdigest()
    _pretrain_run(store, "0" * 64, "other-data")  # another checkpoint's run is not picked
    run_id = _pretrain_run(store, f"sha256:{sha[:16]}")
    lin = resolve_lineage(str(ckpt), seed=0, tracking_uri=store)
    assert (lin.checkpoint_digest, lin.pretrain_run_id, lin.source) == (sha, run_id, "digest")
    assert lin.tags()["lineage.dataset_id"] == "humans-v3" and lin.dataset_uri == "s3://b/humans-v3/"
    assert lin.tags()["lineage.checkpoint_path"] == str(ckpt.resolve())
    by_id = resolve_lineage(str(ckpt), seed=0, pretrain_run_id=run_id, tracking_uri=store)
    assert (by_id.pretrain_run_id, by_id.source, by_id.digest_matches_run) == (run_id, "given", True)


def test_given_run_with_another_digest_is_flagged(tmp_path, store):
    ckpt = tmp_path / "student.safetensors"
    ckpt.write_bytes(b"weights")
    run_id = _pretrain_run(store, "f" * 64)
    lin = resolve_lineage(str(ckpt), seed=0, pretrain_run_id=run_id, tracking_uri=store)
    assert lin.tags()["lineage.digest_matches_pretrain_run"] == "false" and lin.dataset_id == "humans-v3"
    assert resolve_lineage(str(ckpt), seed=0, tracking_uri=store).source == "none"  # no run has this digest
    with pytest.raises(ValueError, match="is not a run in"):
        resolve_lineage(str(ckpt), seed=0, pretrain_run_id="0123456789abcdef", tracking_uri=store)
