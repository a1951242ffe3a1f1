"""The content steps as Ray Data actors (``apply_step``): same rows out as in-process."""

from __future__ import annotations

import pytest

from curation.recipe import HUMANS1B, ContentFiltersConfig, CurationConfig
from curation.steps import apply_step, run_steps_locally
from infra.config import from_dict


def build_content_steps(content: ContentFiltersConfig) -> list:
    cfg = from_dict(CurationConfig, {"input": {"uri": "in"}, "output_dir": "out", "detector": {"backend": "none"}})
    cfg.content = content
    return [s for s in HUMANS1B.build(cfg).row_steps if s.section.startswith("content.")]


@pytest.mark.filterwarnings("ignore::curation.filters.thresholds.UncalibratedThresholdWarning")
def test_steps_run_as_ray_actors(tiny_clip_dir, real_images, batch_of, render, ray_local):
    import ray.data as ray_data

    # Half a CPU each so that three actor pools fit on a 2-CPU test cluster.
    cfg = from_dict(
        ContentFiltersConfig,
        {
            "embedding": {"model": f"local-dir:{tiny_clip_dir}", "num_cpus": 0.5, "batch_size": 4},
            # a random CLIP decides nothing meaningful: score with a soft temperature, never drop
            "artistic": {"enabled": True, "num_cpus": 0.5, "logit_scale": 1.0, "threshold": 1.0},
            "watermark": {"enabled": False},
            "nsfw": {"enabled": False},  # no real weights here (test_content_nsfw runs its head)
            "aesthetic": {"enabled": False},
            "text": {"num_cpus": 0.5, "batch_size": 4},
        },
    )
    images = {k: real_images[k] for k in ("obama", "messi5", "zidane", "starry_night")}
    images["caption_obama"] = render.meme_caption(real_images["obama"])
    batch = batch_of(images, not_pending={"ended": "too_small"})

    ds = ray_data.from_arrow(batch)
    for step in build_content_steps(cfg):
        ds = apply_step(ds, step)
    rows = {r["key"]: r for r in ds.take_all()}

    local = {r["key"]: r for r in run_steps_locally(batch, build_content_steps(cfg)).to_pylist()}
    assert set(rows) == set(local)
    for key, row in local.items():
        assert rows[key]["reason"] == row["reason"]
        assert rows[key]["artistic_label"] == row["artistic_label"]
        assert rows[key]["text_box_count"] == row["text_box_count"]
        if row["clip_embedding"] is None:
            assert rows[key]["clip_embedding"] is None
        else:
            assert rows[key]["clip_embedding"] == pytest.approx(row["clip_embedding"], abs=1e-5)
    assert {k: r["reason"] for k, r in rows.items()} == {
        "obama": None,
        "messi5": "watermark_text",
        "zidane": None,
        "starry_night": None,
        "caption_obama": "text",
        "ended": "too_small",
    }
    assert rows["ended"]["clip_embedding"] is None and rows["ended"]["artistic_score"] is None
    assert len(rows["obama"]["clip_embedding"]) == 32
