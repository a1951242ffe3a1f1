"""Per-sample attributes: cluster ids (``curation.clusters``) on staged embeddings (nesting, counts,
determinism, the two engines), the backbone embedding step on real photos, the largest person
box, and the settings' one-line errors. The curated demo's attributes: tests/curation/test_pipeline.py."""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from curation import output, staging
from curation.clusters import Clusters, ClustersConfig, level_column
from curation.dedup import DECISION_SCHEMA
from curation.dedup.distributed import GlobalDedupInput
from curation.filters.backbone_embedding import BackboneEmbedding, BackboneEmbeddingConfig
from curation.filters.person import max_area
from curation.recipe import CurationConfig
from curation.steps import run_steps_locally
from curation.writer import with_attributes
from infra import storage
from infra.config import load_config
from pipelines.curate import provide_model_code
from tests.conftest import IMAGES, TINY_REFERENCE

EMB = pa.list_(pa.float32())


def staged(root, n: int = 600, partitions: int = 4, seed: int = 0) -> tuple[GlobalDedupInput, set[str]]:
    """``n`` embeddings around 12 centres over ``partitions`` partitions: some rows ended earlier (a
    reason, a failed decode), some dropped by a dedup step. Returns the input and the candidates' keys."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(12, 16))
    x = centres[rng.integers(0, 12, n)] + 0.3 * rng.normal(size=(n, 16))
    pids = [f"p{i:03d}" for i in range(partitions)]
    keys = [f"s{i:05d}" for i in range(n)]
    ok, reason = rng.random(n) > 0.03, [None if rng.random() > 0.05 else "too_small" for _ in range(n)]
    table = pa.table(
        {
            "key": keys,
            "partition": [pids[i] for i in rng.integers(0, partitions, n)],
            "decode_ok": ok,
            "reason": pa.array(reason, pa.string()),
            "emb": pa.array([list(v) if o else None for v, o in zip(x.astype(np.float32), ok)], EMB),
        }
    )
    fs, out = storage.resolve(str(root))
    staging.write_parts(fs, out, table)
    pending = table.filter(pa.array(ok & np.array([r is None for r in reason])))
    dropped = pending.slice(0, 25)  # a dedup step's drops: no ids for them
    for pid in pids:
        rows = dropped.filter(pa.array([p == pid for p in dropped.column("partition").to_pylist()]))
        decisions = pa.table(
            {
                "key": rows.column("key"),
                "reason": ["near_duplicate"] * rows.num_rows,
                "duplicate_of": ["x"] * rows.num_rows,
                "duplicate_group": ["g"] * rows.num_rows,
            }
        ).cast(DECISION_SCHEMA)
        storage.write_parquet(fs, output.decisions_path(out, "dedup.near", pid), decisions)
    candidates = set(pending.column("key").to_pylist()) - set(dropped.column("key").to_pylist())
    return GlobalDedupInput(
        str(root), tuple(pids), ("key", "partition", "emb"), (), ("dedup.near",), str(root)
    ), candidates


def annotated(inp: GlobalDedupInput, cfg: ClustersConfig) -> tuple[pa.Table, dict]:
    """Run the step; (every partition's ids, by key; clusters.json)."""
    Clusters(cfg).annotate(inp, {"emb": "test:embedding"})
    fs, root = storage.resolve(inp.out)
    parts = []
    for pid in inp.pids:
        with fs.open_input_file(output.attributes_path(root, "clusters", pid)) as fh:
            parts.append(pq.read_table(fh))
    return pa.concat_tables(parts).sort_by("key"), json.loads(
        storage.read_bytes(fs, output.path(root, "clusters.json"))
    )


def check_hierarchy(ids: pa.Table, doc: dict, levels: list[int]) -> None:
    """What the loader relies on: ids in range, nesting, counts of every level summing to the samples."""
    assert doc["format"] == 1 and len(doc["levels"]) == len(doc["parents"]) == len(levels)
    assert doc["parents"][0] is None
    for level, spec in enumerate(doc["levels"]):
        column = ids.column(level_column(level)).to_numpy()
        assert ids.schema.field(level_column(level)).type == pa.int32()
        assert 1 <= spec["k"] <= levels[level] and column.min() >= 0 and column.max() < spec["k"]
        found = {str(c): int(n) for c, n in zip(*np.unique(column, return_counts=True))}
        assert spec["counts"] == found  # the clusters that have samples, with their sample counts
        if level:
            parent = {int(c): p for c, p in doc["parents"][level].items()}
            assert sorted(parent) == list(range(spec["k"]))  # every cluster has one parent
            above = ids.column(level_column(level - 1)).to_numpy()
            assert all(parent[int(c)] == int(a) for c, a in zip(column, above))  # nesting, sample by sample
            assert set(parent.values()) == set(range(doc["levels"][level - 1]["k"]))  # every parent has a child


def test_ids_nest_and_clusters_json_counts_them(tmp_path):
    inp, candidates = staged(tmp_path / "run")
    # 40 clusters past max_flat_clusters=10: the finest level is semantic dedup's two-level tree
    cfg = ClustersConfig(
        enabled=True, levels=[3, 10, 40], embedding_column="emb", sample_size=300, max_flat_clusters=10
    )
    ids, doc = annotated(inp, cfg)
    assert set(ids.column("key").to_pylist()) == candidates and ids.num_rows == len(candidates)  # each once
    check_hierarchy(ids, doc, cfg.levels)
    assert [spec["k"] for spec in doc["levels"]] == [3, 10, 40]
    assert doc["embedding"] == "test:embedding"


def test_same_seed_same_ids_another_seed_other_ids(tmp_path):
    inp, _ = staged(tmp_path / "run")
    cfg = ClustersConfig(enabled=True, levels=[4, 16], embedding_column="emb", sample_size=200)
    first, doc = annotated(inp, cfg)
    again, doc_again = annotated(inp, cfg)
    assert again.equals(first) and doc_again == doc
    other, _ = annotated(
        inp, ClustersConfig(enabled=True, levels=[4, 16], embedding_column="emb", sample_size=200, seed=1)
    )
    assert not other.equals(first)


def test_a_level_has_at_most_as_many_clusters_as_samples(tmp_path):
    inp, candidates = staged(tmp_path / "run", n=40)
    ids, doc = annotated(inp, ClustersConfig(enabled=True, levels=[8, 100], embedding_column="emb", sample_size=1000))
    assert doc["levels"][1]["k"] == len(candidates) < 100  # one sample per finest cluster
    check_hierarchy(ids, doc, [8, 100])


def test_no_kept_sample_gives_empty_files_and_levels(tmp_path):
    inp, _ = staged(tmp_path / "run", n=30)
    fs, root = storage.resolve(inp.uri)
    for pid in inp.pids:  # every staged row decided away
        rows = staging.read_partition_rows(fs, root, pid, ["key"])
        n = rows.num_rows
        table = pa.table({"key": rows.column("key"), "reason": ["near_duplicate"] * n, "duplicate_of": ["x"] * n})
        table = table.append_column("duplicate_group", pa.array(["g"] * n)).cast(DECISION_SCHEMA)
        storage.write_parquet(fs, output.decisions_path(root, "dedup.near", pid), table)
    ids, doc = annotated(inp, ClustersConfig(enabled=True, levels=[2, 4], embedding_column="emb", sample_size=10))
    assert ids.num_rows == 0 and [spec["k"] for spec in doc["levels"]] == [0, 0]


@pytest.mark.slow
def test_ray_engine_gives_the_in_process_ids(ray_local, tmp_path):
    inp, _ = staged(tmp_path / "run", n=800)
    local = ClustersConfig(
        enabled=True, levels=[3, 10, 40], embedding_column="emb", sample_size=300, max_flat_clusters=10
    )
    want, want_doc = annotated(inp, local)
    got, got_doc = annotated(inp, dataclasses.replace(local, engine="ray"))
    assert got.equals(want) and got_doc == want_doc
    check_hierarchy(got, got_doc, local.levels)


def test_the_largest_confident_box_over_the_image():
    boxes = [(0, 0, 50, 100), (10, 10, 110, 60), (-20, -20, 20, 20)]  # 5000, 5000, 400 clipped to the image
    assert max_area(boxes, [0.9, 0.5, 0.95], 0.3, 200, 100) == pytest.approx(0.25)
    assert max_area(boxes, [0.1, 0.2, 0.95], 0.3, 200, 100) == pytest.approx(20 * 20 / 20000)
    assert max_area(boxes, [0.1, 0.2, 0.25], 0.3, 200, 100) == 0.0  # no confident box
    assert max_area([], [], 0.3, 200, 100) == 0.0


def test_annotations_must_match_the_kept_rows():
    table = pa.table({"key": ["a", "b", "c"], "partition": ["p"] * 3, "status": ["kept", "dropped", "kept"]})
    ids = pa.table({"key": ["c", "a"], "cluster_l0": pa.array([1, 0], pa.int32())})
    joined = with_attributes(table, ids)
    assert joined.column("cluster_l0").to_pylist() == [0, None, 1]
    for wrong in (ids.slice(0, 1), pa.table({"key": ["a", "b", "c"], "cluster_l0": pa.array([0, 1, 2], pa.int32())})):
        with pytest.raises(RuntimeError, match="do not match the 2 kept rows"):
            with_attributes(table, wrong)


# ---- the backbone embedding step ----------------------------------------------------------------


def backbone_config(**overrides) -> BackboneEmbeddingConfig:
    settings = {
        "enabled": True,
        "model": "sapiens2_tiny",
        "weights": str(TINY_REFERENCE),
        "weights_prefix": "plain/model/",
    }
    return BackboneEmbeddingConfig(**{**settings, **overrides})


def test_backbone_embedding_is_the_models_mean_patch_token(tmp_path):
    """The step on real photos gives what the backbone itself gives (its mean patch token, unit
    length), on pending rows only."""
    import torch

    from models import build_backbone
    from models.sapiens_processing import normalize_image

    provide_model_code()
    photos = [IMAGES / n for n in ("basketball1.png", "franz_kafka.jpg", "messi5.jpg")]
    data = [p.read_bytes() for p in photos]
    batch = pa.table(
        {
            "key": ["a", "b", "c", "d"],
            "decode_ok": [True, True, True, True],
            "reason": pa.array([None, None, "too_small", None], pa.string()),
            "error_message": pa.array([None] * 4, pa.string()),
            "image": [data[0], data[1], data[2], data[2]],
        }
    )
    step = BackboneEmbedding(backbone_config(image_size=[64, 48]))
    step.check()
    out = run_steps_locally(batch, [step]).column("backbone_embedding").to_pylist()
    assert out[2] is None and all(out[i] is not None for i in (0, 1, 3))
    model = build_backbone("sapiens2_tiny", weights=TINY_REFERENCE, weights_prefix="plain/model/").eval()
    for i, raw in zip((0, 1, 3), (data[0], data[1], data[2])):
        rgb = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB").resize((48, 64), Image.Resampling.BILINEAR))
        with torch.inference_mode():
            mean = model(normalize_image(rgb, bgr=False)[None]).patch_tokens.mean(dim=1)[0]
        want = (mean / mean.norm()).numpy()
        assert abs(np.linalg.norm(out[i]) - 1) < 1e-5
        if i == 0:  # a PNG is decoded whole: the same pixels, the same numbers
            np.testing.assert_allclose(out[i], want, atol=1e-5)
        # a JPEG may reach the step as a reduced-scale draft decode: the same picture, not the same
        # pixels (cosine >= 0.9988 here, while other photos' embeddings are at most 0.93 apart)
        assert np.dot(np.array(out[i]), want) > 0.99
    assert np.dot(out[0], out[1]) < 0.95  # other photos, other embeddings


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["clusters.levels=[]"], r"^clusters\.levels must list"),
        (["clusters.levels=[32, 8]"], r"^clusters\.levels must grow"),
        (["clusters.levels=[8, 32]", "clusters.sample_size=16"], r"^clusters\.sample_size=16 is below"),
        (["clusters.engine=spark"], r"clusters\.engine"),
        (["backbone_embedding.image_size=[128]"], r"^backbone_embedding\.image_size must be \[height, width\]"),
    ],
)
def test_bad_settings_are_one_line_errors_naming_them(overrides, message):
    with pytest.raises(ValueError, match=message) as err:
        load_config(CurationConfig, overrides=["input.uri=x", "output_dir=y", "clusters.enabled=true", *overrides])
    one_line(err)


def test_a_recipe_whose_clusters_have_no_embedding_is_refused():
    from curation.recipe import HUMANS1B, weightless_content_filters

    cfg = CurationConfig(content=weightless_content_filters(), clusters=ClustersConfig(enabled=True))
    with pytest.raises(
        ValueError, match=r"'content\.embedding' writes it but is disabled; set content\.embedding\.enabled=true"
    ) as err:
        HUMANS1B.build(cfg)
    one_line(err)
    cfg.clusters.embedding_column = "backbone_embedding"
    with pytest.raises(ValueError, match=r"set backbone_embedding\.enabled=true or clusters\.enabled=false"):
        HUMANS1B.build(cfg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"weights": "/nowhere/tiny.safetensors"},
            r"^backbone_embedding\.weights='/nowhere/tiny\.safetensors': no such",
        ),
        ({"weights_prefix": ""}, r"^backbone_embedding\.weights=.* does not fit .*weights_prefix='': state dict"),
        (
            {"model": "sapiens2_0.4b"},
            r"does not fit backbone_embedding\.model='sapiens2_0\.4b'.*: weights .* look like",
        ),
        ({"model": "sapiens9"}, r"^backbone_embedding\.model='sapiens9': unknown model"),
        ({"image_size": [100, 96]}, r"^backbone_embedding\.image_size=\[100, 96\] must be multiples of .* 16"),
    ],
)
def test_bad_backbone_settings_are_one_line_errors_at_start_up(overrides, message):
    provide_model_code()
    with pytest.raises(ValueError, match=message) as err:
        BackboneEmbedding(backbone_config(**overrides)).check()
    one_line(err)


def test_without_the_model_code_the_step_says_how_to_get_it():
    step = BackboneEmbedding(backbone_config())
    step.code = None  # a process no entry point gave the backbone code
    with pytest.raises(ValueError, match=r"^backbone_embedding: no backbone code .*provide_model_code") as err:
        step.check()
    one_line(err)
