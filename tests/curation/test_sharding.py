"""Mixed shards of one size (``shards.samples_per_shard``): the placement, and the writer on staged tables."""

from __future__ import annotations

import io
import tarfile
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from PIL import Image

from curation import schema, staging
from curation.config import InputConfig, ShardsConfig
from curation.job import job_digest
from curation.recipe import CurationConfig, weightless_content_filters
from curation.sharding import Layout, first_numbers, permute
from curation.writer import PLACE, count_kept, placed_rows, write_mixed_shard, write_partition

NO_DECISIONS = pa.table({"key": pa.array([], pa.string())})


@pytest.mark.parametrize("total", [1, 2, 3, 5, 64, 1000, 4097])
def test_permute_is_a_seeded_bijection(total):
    ranks = permute(np.arange(total), total, seed=7)
    assert sorted(ranks.tolist()) == list(range(total))
    assert permute(np.arange(total), total, seed=7).tolist() == ranks.tolist()  # the same seed, the same order
    if total >= 64:
        assert permute(np.arange(total), total, seed=8).tolist() != ranks.tolist()
        assert ranks.tolist() != list(range(total))


def test_layout_fills_every_shard_but_the_last_and_mixes_the_partitions():
    kept = {f"{p:06d}-x": 100 for p in range(10)}  # ten partitions of 100 kept samples each
    layout, firsts = Layout(samples_per_shard=64, total=1000, seed=0), first_numbers(kept)
    assert layout.num_shards == 16 and [layout.size(s) for s in (0, 14, 15)] == [64, 64, 40]
    placed = {pid: layout.place(firsts[pid], n) for pid, n in kept.items()}
    slots = Counter((int(s), int(p)) for shard, pos in placed.values() for s, p in zip(shard, pos))
    assert len(slots) == 1000 and set(slots.values()) == {1}  # every (shard, position) taken exactly once
    sizes = Counter(s for s, _ in slots)
    assert [sizes[s] for s in range(16)] == [64] * 15 + [40]
    sources = [len({pid for pid, (shard, _) in placed.items() if s in shard}) for s in range(16)]
    assert min(sources) >= 8  # a shard draws from (nearly) every partition, not from one
    assert [layout.stem(s) for s in (0, 15)] == ["000000", "000015"]
    assert Layout(1, 10**7).stem(3) == "0000003"  # names sort in index order past a million shards


def test_layout_is_part_of_the_job_identity():
    def cfg(**shards) -> CurationConfig:
        c = CurationConfig(
            input=InputConfig(uri="/in"), output_dir="/out", content=weightless_content_filters(text=False)
        )
        c.detector.backend = "none"
        c.shards = ShardsConfig(**shards)
        return c

    per_partition = job_digest(cfg())
    assert job_digest(cfg(seed=3)) == per_partition  # no shuffle: its seed decides nothing
    mixed = job_digest(cfg(samples_per_shard=1000))
    assert mixed != per_partition and job_digest(cfg(samples_per_shard=1000, seed=1)) != mixed
    assert job_digest(cfg(samples_per_shard=500)) != mixed
    with pytest.raises(ValueError, match="samples_per_shard"):
        ShardsConfig(samples_per_shard=-1)


def _staged(root, pid: str, n: int) -> None:
    """``n`` decoded rows of partition ``pid`` in staging; every third is dropped by a filter."""
    keys = [f"{pid[:6]}_img{i:02d}" for i in range(n)]
    rows = {f.name: [None] * n for f in schema.BASE_FIELDS}
    rows.update(
        partition=[pid] * n,
        key=keys,
        source=[f"/in/{k}.jpg" for k in keys],
        input_bytes=[100 + i for i in range(n)],
        sha256=[f"sha-{k}" for k in keys],
        decode_ok=[True] * n,
        reason=["too_small" if i % 3 == 2 else None for i in range(n)],
        width=[640] * n,
        height=[480] * n,
        notes=[[] for _ in range(n)],
        image=[f"jpeg of {k}".encode() for k in keys],
        image_ext=["jpg"] * n,
    )
    table = pa.table({f.name: pa.array(rows[f.name], f.type) for f in schema.BASE_FIELDS})
    staging.write_parts(*staging.storage.resolve(str(root)), table)


def _members(path) -> list[str]:
    with tarfile.open(path) as tar:
        return [m.name for m in tar.getmembers()]


def test_mixed_shards_from_staged_partitions(tmp_path):
    """The mixed write without Ray: each partition's placed rows, grouped by shard as the shuffle
    groups them, each group written; then the manifest parts name the shard of every kept row."""
    root, sizes = str(tmp_path), {"000000-a": 7, "000001-b": 12, "000002-c": 5}
    for pid, n in sizes.items():
        _staged(root, pid, n)
    counts = {pid: count_kept(root, pid, NO_DECISIONS) for pid in sizes}
    assert {pid: c["kept"] for pid, c in counts.items()} == {"000000-a": 5, "000001-b": 8, "000002-c": 4}
    layout, firsts = (
        Layout(samples_per_shard=5, total=17, seed=0),
        first_numbers({p: c["kept"] for p, c in counts.items()}),
    )
    done = np.zeros(layout.num_shards, bool)
    rows = pa.concat_tables([placed_rows(root, pid, firsts[pid], NO_DECISIONS, layout, done) for pid in sizes])
    for shard in range(layout.num_shards):
        group = rows.filter(pc.equal(rows.column(PLACE[0]), shard))
        assert write_mixed_shard(group, root, layout).to_pylist() == [{"shard": shard, "samples": layout.size(shard)}]
    for pid in sizes:
        write_partition(root, pid, NO_DECISIONS, placed=(layout, firsts[pid]))

    shards = tmp_path / "shards"
    assert sorted(p.name for p in shards.iterdir()) == [f"00000{i}.{e}" for i in range(4) for e in ("parquet", "tar")]
    in_tars = {}
    for i in range(4):
        names = _members(shards / f"00000{i}.tar")
        keys = [n[: -len(".jpg")] for n in names if n.endswith(".jpg")]
        assert names == [f"{k}.{e}" for k in keys for e in ("jpg", "json")]
        sidecar = pq.read_table(shards / f"00000{i}.parquet")
        assert sidecar.column("key").to_pylist() == keys  # the sidecar lists the tar's samples, in its order
        assert set(sidecar.column("shard").to_pylist()) == {f"00000{i}.tar"} and PLACE[0] not in sidecar.column_names
        in_tars.update(dict.fromkeys(keys, f"00000{i}.tar"))
    assert [len([k for k, s in in_tars.items() if s == f"00000{i}.tar"]) for i in range(4)] == [5, 5, 5, 2]
    assert len({k.split("_")[0] for k, s in in_tars.items() if s == "000000.tar"}) >= 2  # partitions mixed
    manifest = pa.concat_tables([pq.read_table(tmp_path / "manifest" / f"{pid}.parquet") for pid in sizes])
    kept = {r["key"]: r["shard"] for r in manifest.to_pylist() if r["status"] == schema.KEPT}
    assert kept == in_tars  # the manifest names each kept sample's shard
    assert all(r["shard"] is None for r in manifest.to_pylist() if r["status"] != schema.KEPT)

    done[[0, 2]] = True  # a resumed write reads only the samples of the shards still missing
    again = pa.concat_tables([placed_rows(root, pid, firsts[pid], NO_DECISIONS, layout, done) for pid in sizes])
    assert sorted(set(again.column(PLACE[0]).to_pylist())) == [1, 3] and again.num_rows == 7
    with pytest.raises(RuntimeError, match="expected 5"):
        write_mixed_shard(again.filter(pc.equal(again.column(PLACE[0]), 1)).slice(1), root, layout)


# ---- end to end: the demo corpus in mixed shards of 5 -------------------------------------------------

SAMPLES_PER_SHARD = 5


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, ray_local, centernet_path):
    """The demo corpus curated into mixed shards of 5, without the models (their verdicts are not
    what is tested here): every input that survives decode, geometry and dedup is kept."""
    from curation.pipeline import run_curation
    from pipelines.demo_corpus import build_demo_corpus
    from tests.curation.test_pipeline import demo_config

    root = tmp_path_factory.mktemp("mixed")
    build_demo_corpus(root / "raw")
    cfg = demo_config(
        root / "raw", root / "out", centernet_path, shards=ShardsConfig(samples_per_shard=SAMPLES_PER_SHARD)
    )
    cfg.detector.backend, cfg.content = "none", weightless_content_filters(text=False)
    return root / "out", cfg, run_curation(cfg)


def _manifest(out) -> list[dict]:
    return pa.concat_tables([pq.read_table(p) for p in sorted((out / "manifest").glob("*.parquet"))]).to_pylist()


@pytest.mark.slow  # the module's curation run
def test_mixed_shards_are_of_one_size_with_sources_mixed(mixed):
    out, _, result = mixed
    kept = {r["key"]: r for r in _manifest(out) if r["status"] == schema.KEPT}
    tars = sorted((out / "shards").glob("*.tar"))
    sizes = []
    for tar in tars:
        keys = [n[: -len(".jpg")] for n in _members(tar) if n.endswith(".jpg")]
        sizes.append(len(keys))
        assert all(kept[k]["shard"] == tar.name for k in keys)  # the manifest records each sample's shard
        assert pq.read_table(tar.with_suffix(".parquet")).column("key").to_pylist() == keys
    assert sum(sizes) == len(kept) == result.stats["kept"] == result.stats["samples_in_shards"] > SAMPLES_PER_SHARD
    assert sizes[:-1] == [SAMPLES_PER_SHARD] * (len(tars) - 1) and 0 < sizes[-1] <= SAMPLES_PER_SHARD
    assert [t.name for t in tars] == [f"{i:06d}.tar" for i in range(len(tars))]
    partitions = {r["partition"] for r in kept.values()}
    assert len(partitions) > 1 and any(
        len({kept[n[:-4]]["partition"] for n in _members(t) if n.endswith(".jpg")}) > 1 for t in tars
    )
    assert result.stats["samples_per_shard"] == SAMPLES_PER_SHARD and result.stats["reconciled"]


@pytest.mark.slow  # the module's curation run
def test_the_shard_index_opens_with_wids(mixed, tmp_path):
    import json

    import mlflow
    import wids

    out, cfg, result = mixed
    index = json.loads((out / "shardindex.json").read_text())
    assert index["__kind__"] == "wids-shard-index-v1" and index["wids_version"] == 1
    assert [s["url"] for s in index["shardlist"]] == [
        f"shards/{p.name}" for p in sorted((out / "shards").glob("*.tar"))
    ]
    dataset = wids.ShardListDataset(str(out / "shardindex.json"), cache_dir=str(tmp_path / "wids"), transformations=[])
    assert len(dataset) == result.stats["kept"]
    sample = dataset[len(dataset) - 1]  # the last shard's last sample
    kept = {r["key"]: r for r in _manifest(out) if r["status"] == schema.KEPT}
    row = kept[sample["__key__"]]
    image = Image.open(io.BytesIO(sample[".jpg"].read()))
    assert image.size == (row["width"], row["height"]) and sample["__shard__"].endswith(row["shard"])
    logged = mlflow.MlflowClient(cfg.tracking.uri).download_artifacts(
        result.mlflow_run_id, "shardindex.json", str(tmp_path)
    )
    assert [s["url"] for s in json.loads(open(logged).read())["shardlist"]] == result.shards  # absolute, as shards.txt


@pytest.mark.slow  # the module's curation run
def test_pretraining_and_the_audit_read_mixed_shards(mixed):
    from curation.audit.images import fetch_kept
    from curation.audit.loading import load_output
    from curation.output import from_output
    from training.data import ShardStream, fresh_states

    out, _, result = mixed
    version = from_output(str(out))
    state = fresh_states(len(version.shards), rank=0, world_size=1, loader_workers=0)[0]
    keys = list(ShardStream(version.shards, state, seed=0, buffer_size=4).epoch_keys(0))
    kept = sorted(r["key"] for r in _manifest(out) if r["status"] == schema.KEPT)
    assert sorted(keys) == kept  # one epoch of the training stream reads every kept sample once
    audited = load_output(str(out))
    rows = [r for r in audited.rows if r["status"] == schema.KEPT]
    images = fetch_kept(audited.uri, rows)
    assert len(images) == len(kept) and all(isinstance(v, bytes) and v[:2] == b"\xff\xd8" for v in images.values())
