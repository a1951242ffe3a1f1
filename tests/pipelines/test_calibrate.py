"""``pipelines/calibrate.py``: the threshold rules on handmade scores, then the command on real
image files through a tiny open_clip model and heads this test builds and saves, with bad files
and bad settings among them."""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from curation.filters.thresholds import UncalibratedThresholdWarning
from pipelines.calibrate import Rule, choose, curve, main
from tests.curation.filters.conftest import TINY_CLIP

# ---- the rules, on scores whose every count is worked out by hand --------------------------------

# Drop at or above: candidates 0.1 (drops all), then halfway between neighbours.
POS, NEG = [0.9, 0.8, 0.6, 0.3], [0.7, 0.2, 0.1]
ABOVE = {  # threshold -> (positives dropped, negatives dropped)
    0.1: (4, 3),
    0.15: (4, 2),
    0.25: (4, 1),
    0.45: (3, 1),
    0.65: (2, 1),
    0.75: (2, 0),
    0.85: (1, 0),
}


def test_the_curve_counts_every_candidate():
    points = curve(np.array(POS), np.array(NEG), drops_below=False)
    assert {p.threshold: (p.tp, p.fp) for p in points} == ABOVE
    assert all(p.tp + p.fn == 4 and p.fp + p.tn == 3 for p in points)
    at = {p.threshold: p for p in points}
    assert (at[0.25].precision, at[0.25].recall, round(at[0.25].f1, 6)) == (0.8, 1.0, round(8 / 9, 6))


@pytest.mark.parametrize(
    ("rule", "threshold"),
    [("max_f1", 0.25), ("precision=0.9", 0.75), ("precision=1", 0.75), ("recall=0.75", 0.25), ("recall=1", 0.25)],
)
def test_each_rule_picks_its_point(rule, threshold):
    points = curve(np.array(POS), np.array(NEG), drops_below=False)
    assert points[choose(points, Rule.parse(rule))].threshold == threshold


def test_a_minimum_drops_below_it():
    # aesthetic: positives are the low scores; drop below 2.5 takes both clean positives
    points = curve(np.array([1.0, 2.0, 4.5]), np.array([3.0, 5.0, 6.0]), drops_below=True)
    at = {p.threshold: (p.tp, p.fp) for p in points}
    assert at == {1.5: (1, 0), 2.5: (2, 0), 3.75: (2, 1), 4.75: (3, 1), 5.5: (3, 2), 6.000001: (3, 3)}
    assert points[choose(points, Rule.parse("max_f1"))].threshold == 4.75  # F1 6/7
    assert points[choose(points, Rule.parse("precision=1"))].threshold == 2.5


def test_an_unreachable_target_and_a_bad_rule_are_one_line_errors():
    points = curve(np.array([0.1]), np.array([0.9]), drops_below=False)
    with pytest.raises(ValueError, match=r"no threshold reaches precision 0.9 on these images \(the best is 0.500"):
        choose(points, Rule.parse("precision=0.9"))
    for bad in ("precision=1.5", "f1", "max_f1=0.3", "recall=x"):
        with pytest.raises(ValueError, match="expected max_f1, precision=P or recall=R"):
            Rule.parse(bad)


# ---- the command, end to end ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    """positives/: a real painting and rendered figures, plus a truncated JPEG; negatives/: the demo
    corpus' real photos of people, an empty file and a hidden one (not an input)."""
    from evaluation.synthetic import render_sample
    from pipelines.demo_corpus import SHARED_IMAGES, build_demo_corpus

    demo = tmp_path_factory.mktemp("demo")
    build_demo_corpus(demo)
    root = tmp_path_factory.mktemp("labelled")
    pos, neg = root / "positives", root / "negatives" / "people"
    pos.mkdir()
    neg.mkdir(parents=True)
    Image.open(SHARED_IMAGES / "starry_night.jpg").save(pos / "starry_night.png")
    for i in range(4):
        sample = render_sample(np.random.default_rng([7, i]), (256, 192))
        Image.fromarray(sample["image"]).save(pos / f"render{i}.png")
    (pos / "truncated.jpg").write_bytes((demo / "bad" / "truncated.jpg").read_bytes())
    for photo in sorted((demo / "people").glob("*.jpg")):
        (neg / photo.name).write_bytes(photo.read_bytes())
    (root / "negatives" / "empty.jpg").write_bytes(b"")
    (neg / ".DS_Store").write_bytes(b"not an input")
    return root


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory) -> Path:
    """A random tiny CLIP from ``open_clip.create_model_and_transforms(name, pretrained=None)``,
    saved as an open_clip local folder (config + weights)."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tiny_clip")
    (folder / "tiny-calibrate-clip.json").write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(folder / "tiny-calibrate-clip.json")
    torch.manual_seed(3)
    model, _, _ = open_clip.create_model_and_transforms("tiny-calibrate-clip", pretrained=None)
    model_dir = folder / "model"
    model_dir.mkdir()
    (model_dir / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CLIP}))
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, str(model_dir / "open_clip_model.safetensors")
    )
    return model_dir


def embeddings(clip: Path, folder: Path) -> dict[str, np.ndarray]:
    """The embedding of each scorable labelled image by its key (``positives/...``), from the
    curation's decode and CLIP steps."""
    from curation.config import DecodeConfig
    from curation.decode import Decode
    from curation.filters.clip_embedding import ContentEmbedding, ContentEmbeddingConfig
    from curation.steps import run_steps_locally
    from pipelines.calibrate import labelled_files, raw_rows

    steps = [Decode(DecodeConfig()), ContentEmbedding(ContentEmbeddingConfig(model=f"local-dir:{clip}", device="cpu"))]
    paths = [p for found in labelled_files(folder).values() for p in found]
    out = run_steps_locally(raw_rows(paths, folder), steps).to_pydict()
    return {k: np.array(e, np.float64) for k, e in zip(out["key"], out["clip_embedding"]) if e is not None}


# The logit the test's head gives each scorable image: positives 5 ... 1, one hard negative (a
# photo) between the two lowest positives, the other negatives -1, -2, ...
HARD = "negatives/people/grace_hopper.jpg"


def target_logits(keys: list[str]) -> dict[str, float]:
    positives = sorted(k for k in keys if k.startswith("positives/"))
    negatives = sorted(k for k in keys if k.startswith("negatives/") and k != HARD)
    return {
        **{k: 5.0 - i for i, k in enumerate(positives)},
        HARD: 1.5,
        **{k: -1.0 - i for i, k in enumerate(negatives)},
    }


@pytest.fixture(scope="module")
def head(tmp_path_factory, tiny_clip, labelled) -> tuple[Path, dict[str, float]]:
    """A linear head whose weights are set (least squares through the curation's embeddings) so
    that each image gets its ``target_logits``; the file and the logits it gives, in float32."""
    import torch

    emb = embeddings(tiny_clip, labelled)
    want = target_logits(list(emb))
    x = np.stack([emb[k] for k in want])
    wb = np.linalg.lstsq(np.c_[x, np.ones(len(x))], np.array(list(want.values())), rcond=None)[0]
    weight, bias = torch.tensor(wb[None, :-1], dtype=torch.float32), torch.tensor(wb[-1:], dtype=torch.float32)
    given = (torch.tensor(x, dtype=torch.float32) @ weight.T + bias)[:, 0].numpy()
    assert np.abs(given - np.array(list(want.values()))).max() < 0.05  # the construction holds in float32
    path = tmp_path_factory.mktemp("head") / "artistic_head.pt"
    torch.save({"weight": weight, "bias": bias}, path)
    return path, dict(zip(want, given.tolist()))


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_artistic_threshold_from_labelled_images(capsys, tmp_path, labelled, tiny_clip, head):
    from curation.filters.artistic import ContentArtistic
    from curation.recipe import CurationConfig
    from infra.config import load_config

    clip = [f"content.embedding.model=local-dir:{tiny_clip}", "content.embedding.device=cpu"]
    overrides = [*clip, f"content.artistic.head_weights={head[0]}", "content.artistic.device=cpu"]
    out_file = tmp_path / "artistic.yaml"
    rc, out, err = _run(capsys, "artistic", labelled, "--out", out_file, *overrides)
    assert rc == 0, err
    assert "artistic: 5 positives, 9 negatives scored; left out: positives: {'truncated': 1}; " in out
    assert "negatives: {'empty_file': 1}" in out
    # max F1: every positive and the hard negative dropped (the hand count: F1 = 10/11)
    assert "drops 5 of 5 positives and 1 of 9 negatives: precision 0.833, recall 1.000, F1 0.909" in out
    assert re.search(r"^ +\S+ +5 +1 +0 +8 +0.833 +1.000 0.909   <- chosen$", out, re.M), out
    section = yaml.safe_load(out_file.read_text())["content"]["artistic"]
    assert section["enabled"] is True
    threshold, record = section["threshold"], section["calibration"]
    p = {k: 1 / (1 + np.exp(-v)) for k, v in head[1].items()}
    assert max(v for k, v in p.items() if k.startswith("negatives/") and k != HARD) < threshold <= p[HARD]
    assert record.startswith("artistic by pipelines/calibrate.py on ")
    head_sha = hashlib.sha256(head[0].read_bytes()).hexdigest()
    assert f"content.artistic.head_weights sha256:{head_sha}" in record
    assert "5 positives, 9 negatives scored, 2 left out; rule max_f1: precision 0.833, recall 1.000" in record

    # the fragment is a job config: the step it builds takes that threshold with no warning
    cfg = load_config(CurationConfig, out_file, overrides)
    step = ContentArtistic.from_config(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncalibratedThresholdWarning)
        step.check()
    assert step.enabled and step.cfg.threshold == threshold
    assert step.describe()["threshold_source"] == f"calibration: {record}"


def test_a_precision_target_keeps_the_hard_negative(capsys, tmp_path, labelled, tiny_clip, head):
    overrides = [f"content.embedding.model=local-dir:{tiny_clip}", f"content.artistic.head_weights={head[0]}"]
    rc, out, err = _run(capsys, "artistic", labelled, "--rule", "precision=1", "--out", tmp_path / "a.yaml", *overrides)
    assert rc == 0, err
    assert "drops 4 of 5 positives and 0 of 9 negatives: precision 1.000, recall 0.800, F1 0.889" in out
    threshold = yaml.safe_load((tmp_path / "a.yaml").read_text())["content"]["artistic"]["threshold"]
    p = {k: 1 / (1 + np.exp(-v)) for k, v in head[1].items()}
    assert p[HARD] < threshold <= sorted(v for k, v in p.items() if k.startswith("positives/"))[1]


def test_a_minimum_score_is_calibrated_below(capsys, tmp_path, labelled, tiny_clip, head):
    """The aesthetic predictor's layout carrying 5 - the head's logit: the positives (to drop)
    score low, and min_score drops below it."""
    import torch

    from curation.filters.model import LinearHead
    from tests.curation.filters.test_content_aesthetic import AestheticMLP

    linear = LinearHead.load(head[0])
    mlp = AestheticMLP(linear.dim)
    with torch.no_grad():
        for i in (0, 2, 4, 6, 7):
            layer = mlp.layers[i]
            layer.weight.zero_()
            layer.bias.zero_()
            layer.weight[0, 0] = 1.0
        mlp.layers[0].weight[0] = -torch.from_numpy(linear.weight_KD[0])
        mlp.layers[0].bias[0] = 5.0 - float(linear.bias_K[0])
    weights = tmp_path / "aesthetic.pth"
    torch.save(mlp.state_dict(), weights)
    overrides = [f"content.embedding.model=local-dir:{tiny_clip}", f"content.aesthetic.weights={weights}"]
    rc, out, err = _run(capsys, "aesthetic", labelled, "--out", tmp_path / "b.yaml", *overrides)
    assert rc == 0, err
    assert "content.aesthetic.min_score=" in out
    assert "drops 5 of 5 positives and 1 of 9 negatives: precision 0.833, recall 1.000, F1 0.909" in out
    section = yaml.safe_load((tmp_path / "b.yaml").read_text())["content"]["aesthetic"]
    score = {k: 5.0 - v for k, v in head[1].items()}
    assert (
        score[HARD]
        < section["min_score"]
        <= min(v for k, v in score.items() if k.startswith("negatives/") and k != HARD)
    )


def test_bad_inputs_are_one_line_errors(capsys, tmp_path, labelled, tiny_clip):
    clip = f"content.embedding.model=local-dir:{tiny_clip}"
    rc, _, err = _run(capsys, "artistic", tmp_path / "nowhere", clip)
    assert (rc, err) == (2, f"error: {tmp_path / 'nowhere'}: no such folder (it must hold positives/ and negatives/)\n")
    empty = tmp_path / "empty"
    (empty / "positives").mkdir(parents=True)
    (empty / "negatives").mkdir()
    rc, _, err = _run(capsys, "artistic", empty, clip)
    assert (rc, err) == (2, f"error: {empty / 'positives'}: no files; put images the filter must drop there\n")
    rc, _, err = _run(capsys, "nsfw", labelled, clip)
    assert rc == 2 and err.startswith("error: content.nsfw.weights is not set") and err.count("\n") == 1
    missing = tmp_path / "head.pt"
    rc, _, err = _run(capsys, "artistic", labelled, clip, f"content.artistic.head_weights={missing}")
    assert rc == 2 and "content.artistic.head_weights=" in err and "no such file" in err and err.count("\n") == 1
    rc, _, err = _run(capsys, "artistic", labelled, "--rule", "precision=2", clip)
    assert (rc, err.count("\n")) == (2, 1) and "expected max_f1, precision=P or recall=R" in err
