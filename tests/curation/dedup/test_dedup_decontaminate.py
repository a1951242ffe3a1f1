"""Decontamination (``dedup.decontaminate``): the run's exact and near copies of evaluation images
are dropped as ``eval_overlap``. Both sides are hashed by the pipeline's own reader and decode
step; the reason is the dedup.decontaminate step's in the funnel and the audit with no hand edit; the
local and Ray engines decide the same."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image, ImageOps

from curation import staging
from curation.audit import counts, settings
from curation.config import InputConfig
from curation.decode import Decode, DecodeConfig
from curation.dedup.decisions import GlobalDedupInput, partition_decisions
from curation.dedup.eval_overlap import EVAL_OVERLAP, EvalSet, semantic_overlap
from curation.dedup.steps import DedupContext, DedupStep, run_global_dedup
from curation.eval_set import read_eval_set
from curation.job import CurationJob
from curation.passes import evaluation_set
from curation.readers import Input
from curation.recipe import HUMANS1B, CurationConfig
from curation.stats import stats_from_counts
from curation.steps import BuiltRecipe, run_steps_locally
from infra import storage
from tests.conftest import IMAGES
from tests.curation.mean_colour import MeanColour

COLUMNS = ("key", "partition", "sha256", "width", "height", "input_bytes", "converted", "phash", "phash_mirror")


def folders(tmp_path):
    """An evaluation set of three photos, and a corpus holding a byte copy of one, a resized copy
    of another, a mirrored copy of the third, two unrelated photos and a repost of one of them."""
    ev, corpus = tmp_path / "eval", tmp_path / "corpus"
    (ev / "val").mkdir(parents=True)
    corpus.mkdir()
    for name in ("messi5", "obama", "franz_kafka"):
        Image.open(IMAGES / f"{name}.jpg").convert("RGB").save(ev / "val" / f"{name}.jpg", quality=92)
    shutil.copy(ev / "val" / "messi5.jpg", corpus / "messi_copy.jpg")
    obama = Image.open(ev / "val" / "obama.jpg")
    obama.resize((obama.width // 2, obama.height // 2)).save(corpus / "obama_small.jpg", quality=80)
    ImageOps.mirror(Image.open(ev / "val" / "franz_kafka.jpg")).save(corpus / "kafka_mirror.jpg", quality=90)
    Image.open(IMAGES / "obama2.jpg").convert("RGB").save(corpus / "obama2.jpg", quality=90)
    Image.open(IMAGES / "basketball1.png").convert("RGB").save(corpus / "basketball.jpg", quality=90)
    shutil.copy(corpus / "basketball.jpg", corpus / "basketball_repost.jpg")
    return ev, corpus


def recipe_steps(eval_images: str) -> BuiltRecipe:
    """The shipped recipe's steps (no start-up checks: no model weights here) with ``eval_images``."""
    cfg = CurationConfig()
    cfg.dedup.decontaminate.eval_images = eval_images
    return BuiltRecipe([s.from_config(cfg) for s in HUMANS1B.steps])


def staged(corpus, out) -> tuple[GlobalDedupInput, dict[str, str]]:
    """The corpus read and decoded as pass 1 does it, staged in two partitions; key -> file name."""
    reader = Input(InputConfig(uri=str(corpus), images_per_partition=3))
    fs, root = storage.resolve(str(out))
    names, pids = {}, []
    for p in reader.plan():
        for table in reader.read(p):
            rows = run_steps_locally(table, [Decode(DecodeConfig())])
            staging.write_parts(fs, root, rows)
            names.update({r["key"]: r["source"].rsplit("/", 1)[1] for r in rows.select(["key", "source"]).to_pylist()})
        pids.append(p.id)
    return GlobalDedupInput(str(out), tuple(pids), COLUMNS, shuffle_partitions=2), names


def decisions_by_name(inp: GlobalDedupInput, names: dict[str, str]) -> dict[str, tuple[str, str, str]]:
    fs, root = storage.resolve(inp.uri)
    rows = pa.concat_tables([partition_decisions(fs, root, pid) for pid in inp.pids]).to_pylist()
    return {
        names[r["key"]]: (r["reason"], names.get(r["duplicate_of"], r["duplicate_of"]), r["duplicate_group"])
        for r in rows
    }


@pytest.mark.slow
def test_copies_of_evaluation_images_are_dropped_as_eval_overlap_by_both_engines(ray_local, tmp_path):
    ev_dir, corpus = folders(tmp_path)
    built = recipe_steps(str(ev_dir))
    steps = built.of_kind(DedupStep)  # the recipe's enabled global steps, in order
    cfg = CurationConfig(output_dir=str(tmp_path / "local"))
    cfg.dedup.decontaminate.eval_images = str(ev_dir)
    job = CurationJob(cfg, built, "test", *storage.resolve(str(tmp_path / "local")))
    ev = evaluation_set(job, steps)  # read as the run reads it: the recipe's reader and decode step
    reader = Input(InputConfig(uri=str(ev_dir)))
    assert sorted(ev.rows.column("source").to_pylist()) == ["val/franz_kafka.jpg", "val/messi5.jpg", "val/obama.jpg"]
    embedded = read_eval_set(reader, Decode(DecodeConfig()), MeanColour(), relative_to=str(ev_dir))
    assert embedded.select(list(ev.rows.column_names)).equals(ev.rows)  # the same rows, with the embedding step's
    assert [len(v) for v in embedded.column("clip_embedding").to_pylist()] == [3, 3, 3]
    assert [s.name for s in steps] == ["dedup.decontaminate", "dedup.exact", "dedup.near"]
    want = {
        "messi_copy.jpg": (EVAL_OVERLAP, "val/messi5.jpg", "eval:exact"),
        "obama_small.jpg": (EVAL_OVERLAP, "val/obama.jpg", "eval:near"),
        "kafka_mirror.jpg": (EVAL_OVERLAP, "val/franz_kafka.jpg", "eval:near"),
    }
    inp, names = staged(corpus, tmp_path / "local")
    dropped = run_global_dedup(steps, inp, DedupContext(engine="local", eval_set=ev))
    got = decisions_by_name(inp, names)
    repost = got.pop("basketball_repost.jpg", None) or got.pop("basketball.jpg")
    assert repost[0] == "exact_duplicate" and got == want  # first, so no copy is a duplicate of another
    assert dropped == {"dedup.decontaminate": 3, "dedup.exact": 1, "dedup.near": 0}
    inp, names = staged(corpus, tmp_path / "ray")  # Ray tasks, one per partition (exact and near: test_dedup_ray)
    assert run_global_dedup(steps[:1], inp, DedupContext(engine="ray", eval_set=ev)) == {"dedup.decontaminate": 3}
    assert decisions_by_name(inp, names) == want


def test_the_decontaminate_step_owns_eval_overlap_in_the_funnel_and_the_audit():
    assert "dedup.decontaminate" not in [name for name, _ in recipe_steps("").funnel()]  # off by default
    funnel = recipe_steps("/data/eval").funnel()
    assert ("dedup.decontaminate", (EVAL_OVERLAP,)) in funnel
    assert [n for n, _ in funnel].index("dedup.decontaminate") < [n for n, _ in funnel].index("dedup.exact")
    rows = [
        {"status": "kept", "reason": None, "notes": []},
        {"status": "dropped", "reason": EVAL_OVERLAP, "notes": []},
        {"status": "dropped", "reason": EVAL_OVERLAP, "notes": []},
    ]
    summed = {
        "inputs": 3,
        "status": {"kept": 1, "dropped": 2},
        "reasons": {EVAL_OVERLAP: 2},
        "notes": {},
        "dropped_by_reason": {EVAL_OVERLAP: 2},
        "errors_by_reason": {},
    }
    stats = stats_from_counts(summed, funnel, samples_in_shards=1, shards=1, descriptions=[])
    step = next(s for s in stats["funnel"] if s["step"] == "dedup.decontaminate")
    assert step["removed"] == {EVAL_OVERLAP: 2} and stats["reconciled"]
    assert counts.by_reason(rows, stats) == [
        {"status": "dropped", "reason": EVAL_OVERLAP, "count": 2, "step": "dedup.decontaminate"}
    ]
    change = settings.Change("dedup.decontaminate.eval_images", "", "/data/eval")
    assert settings.explaining(EVAL_OVERLAP, [change], "dedup.decontaminate") == ["dedup.decontaminate.eval_images"]


def test_semantic_overlap_takes_the_closest_evaluation_image():
    rng = np.random.default_rng(0)
    x_eval = rng.normal(size=(5, 8))
    x = rng.normal(size=(6, 8))
    x[0] = x_eval[3] + rng.normal(scale=1e-3, size=8)  # a copy of eval image 3
    x[1] = x_eval[1]  # identical to eval image 1 ...
    x_eval[4] = x_eval[1]  # ... and to eval image 4, whose source sorts first
    emb = pa.list_(pa.float32())
    ev = EvalSet(
        pa.table(
            {
                "source": [f"e{i}" if i != 4 else "a4" for i in range(5)],
                "clip_embedding": pa.array(list(x_eval.astype(np.float32)), emb),
            }
        )
    )
    table = pa.table({"key": [f"k{i}" for i in range(6)], "clip_embedding": pa.array(list(x.astype(np.float32)), emb)})
    out = semantic_overlap(table, ev, "clip_embedding", 0.99).to_pylist()
    assert [(r["key"], r["duplicate_of"], r["duplicate_group"]) for r in out] == [
        ("k0", "e3", "eval:semantic"),
        ("k1", "a4", "eval:semantic"),
    ]
    assert {r["reason"] for r in out} == {EVAL_OVERLAP}


def test_the_evaluation_set_enters_the_job_by_its_content_not_its_path(tmp_path):
    from curation.filters.person import DetectorConfig
    from curation.job import job_digest
    from curation.recipe import weightless_content_filters

    ev_dir, corpus = folders(tmp_path)

    def job(eval_images: str) -> str:
        cfg = CurationConfig(
            input=InputConfig(uri=str(corpus)),
            output_dir=str(tmp_path / "out"),
            detector=DetectorConfig(backend="none"),
            content=weightless_content_filters(text=False),
        )
        cfg.dedup.decontaminate.eval_images = eval_images
        return job_digest(cfg)

    here = job(str(ev_dir))
    shutil.copytree(ev_dir, tmp_path / "elsewhere")
    assert job(str(tmp_path / "elsewhere")) == here != job("")
    (tmp_path / "elsewhere" / "val" / "obama.jpg").write_bytes(b"other bytes")
    assert job(str(tmp_path / "elsewhere")) != here
