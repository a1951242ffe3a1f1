"""Before any training: label files that do not fit their vocabulary fail with one line naming
the file and what was expected; the augmentations keep labels and pixels in step."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from evaluation.config import SplitPaths
from evaluation.datasets import CocoKeypointDataset, DenseMapDataset, SegmentationDataset
from evaluation.finetune import augment
from evaluation.finetune.config import AugmentConfig, FinetuneConfig
from evaluation.finetune.run import check_inputs
from evaluation.finetune.tasks import resolve_inputs
from evaluation.heatmaps import decode_heatmaps
from models.vocab import keypoint_vocab, seg_vocab
from tests.evaluation.conftest import HW

NO_AUG = AugmentConfig(
    enabled=True,
    scale=(1.0, 1.0),
    rotation_prob=0.0,
    flip_prob=0.0,
    half_body_prob=0.0,
    photometric_prob=0.0,
    background_prob=0.0,
)


def config(tmp_path, **sections) -> FinetuneConfig:
    cfg = FinetuneConfig(output_dir=str(tmp_path / "out"), **sections)
    return dataclasses.replace(cfg, **{t: dataclasses.replace(cfg.task(t), image_size=list(HW)) for t in cfg.tasks})


def copy_split(root, split: str, sub: str, dest):
    shutil.copytree(root / split / "images", dest / split / "images")
    if sub.endswith(".json"):
        shutil.copy(root / split / sub, dest / split / sub)
    else:
        shutil.copytree(root / split / sub, dest / split / sub)
    return dest / split


def test_a_keypoint_file_of_another_keypoint_count_is_refused_before_training(synthetic_root, tmp_path):
    train, val = (copy_split(synthetic_root, s, "person_keypoints.json", tmp_path / "d") for s in ("train", "val"))
    pose = dataclasses.replace(
        FinetuneConfig().pose,
        train=SplitPaths(images=str(train / "images"), labels=str(train / "person_keypoints.json")),
        val=SplitPaths(images=str(val / "images"), labels=str(val / "person_keypoints.json")),
    )
    cfg = config(tmp_path, tasks=["pose"], pose=pose, vocab="coco_wholebody_133")
    with pytest.raises(
        ValueError,
        match=r"^pose labels .*train/person_keypoints.json: 17 keypoints per person, "
        r"expected 133 \(vocabulary coco_wholebody_133\)$",
    ):
        check_inputs(cfg, resolve_inputs(cfg, tmp_path / "out"))
    # one annotation with a keypoint missing: named by file and annotation
    data = json.loads((val / "person_keypoints.json").read_text())
    data["annotations"][2]["keypoints"] = data["annotations"][2]["keypoints"][:-3]
    (val / "person_keypoints.json").write_text(json.dumps(data))
    cfg = dataclasses.replace(cfg, vocab="coco_17")
    with pytest.raises(ValueError, match=r"val/person_keypoints.json, annotation 3: 'keypoints' must be 51 numbers"):
        check_inputs(cfg, resolve_inputs(cfg, tmp_path / "out"))


def test_a_mask_with_class_ids_outside_the_vocabulary_is_refused_before_training(synthetic_root, tmp_path):
    train, val = (copy_split(synthetic_root, s, "seg", tmp_path / "d") for s in ("train", "val"))
    bad = val / "seg" / "000004.png"
    mask = np.array(Image.open(bad))
    mask[0, :3] = [7, 9, 9]
    Image.fromarray(mask).save(bad)
    seg = dataclasses.replace(
        FinetuneConfig().seg,
        train=SplitPaths(images=str(train / "images"), labels=str(train / "seg")),
        val=SplitPaths(images=str(val / "images"), labels=str(val / "seg")),
    )
    cfg = config(tmp_path, tasks=["seg"], seg=seg, vocab="seg_synthetic_7")
    with pytest.raises(
        ValueError,
        match=r"^seg labels .*val/seg/000004.png: class ids \[7, 9\] outside the "
        r"vocabulary seg_synthetic_7 \(0..6, ignore 255\)$",
    ):
        check_inputs(cfg, resolve_inputs(cfg, tmp_path / "out"))
    assert (
        check_inputs(
            dataclasses.replace(cfg, vocab="seg_goliath_28"),
            resolve_inputs(dataclasses.replace(cfg, vocab="seg_goliath_28"), tmp_path / "out"),
        )
        is None
    )


def test_pose_flip_moves_each_keypoint_to_its_mirror_and_swaps_left_and_right(synthetic_root):
    base = CocoKeypointDataset(
        synthetic_root / "train" / "images",
        synthetic_root / "train" / "person_keypoints.json",
        image_size=HW,
        heatmap_sigma=1.0,
    )
    vocab = keypoint_vocab("coco_17")
    plain = augment.pose_item(base, 0, np.random.default_rng(0), NO_AUG, vocab)
    flipped = augment.pose_item(base, 0, np.random.default_rng(0), dataclasses.replace(NO_AUG, flip_prob=1.0), vocab)
    np.testing.assert_allclose(flipped["image"].numpy(), plain["image"].numpy()[:, :, ::-1], atol=1e-5)
    xy, _ = decode_heatmaps(plain["heatmaps"][None], HW)
    fxy, _ = decode_heatmaps(flipped["heatmaps"][None], HW)
    order = list(vocab.flip_indices)
    ok = (plain["weights"].numpy() > 0) & (flipped["weights"].numpy()[order] > 0)
    np.testing.assert_allclose(fxy[0].numpy()[order][ok, 0], (HW[1] - 1) - xy[0].numpy()[ok, 0], atol=0.3)
    np.testing.assert_allclose(fxy[0].numpy()[order][ok, 1], xy[0].numpy()[ok, 1], atol=0.3)


def test_seg_and_normal_augmentations_transform_labels_with_the_pixels(synthetic_root):
    seg = SegmentationDataset(
        synthetic_root / "val" / "images", synthetic_root / "val" / "seg", image_size=HW, num_classes=7
    )
    seg.with_image = False
    vocab = seg_vocab("seg_synthetic_7")
    plain = augment.seg_item(seg, 1, np.random.default_rng(0), NO_AUG, vocab, augment.Backgrounds(""))
    flipped = augment.seg_item(
        seg, 1, np.random.default_rng(0), dataclasses.replace(NO_AUG, flip_prob=1.0), vocab, augment.Backgrounds("")
    )
    expect = np.asarray(vocab.flip_map())[plain["labels"].numpy()[:, ::-1]]
    assert np.array_equal(flipped["labels"].numpy(), expect) and (expect == vocab.classes.index("left_arm")).any()
    normal = DenseMapDataset(
        synthetic_root / "val" / "images",
        synthetic_root / "val" / "normal",
        synthetic_root / "val" / "masks",
        image_size=HW,
        kind="normal",
    )
    normal.with_image = False
    aug = dataclasses.replace(NO_AUG, flip_prob=1.0, rotation_prob=1.0, rotation_deg=90.0)
    out = augment.dense_item(normal, 1, np.random.default_rng(5), aug, augment.Backgrounds(""))
    n = out["target"].numpy()[:, out["mask"].numpy()]
    assert np.allclose(np.linalg.norm(n, axis=0), 1.0, atol=1e-5) and (n[2] < 0).all()  # still unit, still facing us


def test_depth_target_is_made_relative_again_after_zoom_and_rotation(synthetic_root):
    """Depth comes from the pointmaps' Z; after a zoom and a rotation the target is the
    relative depth of the pixels still on the person: [0, 1] where counted, min 0, max 1."""
    from evaluation.finetune.tasks import synthetic_data

    paths = synthetic_data("depth", synthetic_root).val
    depth = DenseMapDataset(paths.images, paths.labels, paths.masks, image_size=HW, kind="depth")
    depth.with_image = False
    aug = dataclasses.replace(NO_AUG, scale=(1.6, 1.6), rotation_prob=1.0, rotation_deg=40.0)
    zoomed = 0
    for i in range(len(depth)):
        before = depth[i]["target"][0].numpy()
        out = augment.dense_item(depth, i, np.random.default_rng(i), aug, augment.Backgrounds(""))
        t, m = out["target"][0].numpy(), out["mask"].numpy()
        fg = t >= 0
        assert m.any() and (t[m] > 0).all() and (t[m] <= 1).all() and (t[~fg] == -1).all()
        assert t[fg].min() == 0.0 and t[fg].max() == 1.0 and np.array_equal(m, fg & (t > 1e-6))
        zoomed += fg.sum() < (before >= 0).sum() or not np.isin(t[fg], before[before >= 0]).all()
    assert zoomed  # the zoom cut some people, so their target was normalised again


@pytest.mark.parametrize("name", ["sapiens2_tiny", "sapiens_tiny"])
def test_both_families_fine_tune_in_process_and_export_the_released_layout(name, synthetic_root, tmp_path):
    """Three steps of each family on the synthetic seg split (no Ray): the loss is finite, the
    weights move, the export holds ``backbone.`` + the backbone's own keys and ``decode_head.``."""
    import torch

    from evaluation.finetune.data import train_loader
    from evaluation.finetune.engine import build_finetuner, evaluate, train_step
    from evaluation.finetune.loop import export
    from evaluation.finetune.tasks import TaskInputs, synthetic_data
    from models import build_backbone
    from models.io import load_state_dict_file

    cfg = dataclasses.replace(
        config(tmp_path, tasks=["seg"], steps=3, batch_size_per_worker=2),
        backbone=dataclasses.replace(FinetuneConfig().backbone, name=name),
    )
    cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, precision="fp32"))
    data = synthetic_data("seg", synthetic_root)
    data.num_classes, data.class_names = 7, list(seg_vocab("seg_synthetic_7").classes)
    ft = build_finetuner(cfg, "seg", TaskInputs(data, seg_vocab("seg_synthetic_7")), device=torch.device("cpu"))
    before = {k: v.clone() for k, v in ft.model.backbone.state_dict().items()}
    for step, batch in enumerate(
        train_loader(ft.train_set, global_batch=2, seed=0, start=0, stop=3, rank=0, world=1, workers=0)
    ):
        assert np.isfinite(train_step(ft, batch, step)["loss"])
    assert "mIoU" in evaluate(ft).compute()
    assert any(not torch.equal(before[k], v) for k, v in ft.model.backbone.state_dict().items())
    info = export(ft, tmp_path / "seg", rank=0, meta={"pretrain_run_id": "x"})
    weights = load_state_dict_file(info["export"])
    backbone_keys = {k.removeprefix("backbone.") for k in weights if k.startswith("backbone.")}
    assert backbone_keys == set(build_backbone(name, device="meta").state_dict())
    assert all(k.startswith(("backbone.", "decode_head.")) for k in weights) and len(info["export_sha256"]) == 64
