"""Earlier versions' index parts are found again after their outputs are moved: a header names an
earlier part by its owner (dataset version id), its path in the owner's index folder and two
hints (relative to the header's folder, absolute); an open resolves each part through the
locations passed now (``dedup.against``, ``dedup.near.index_locations``), then the hints, and
fails in one line naming the missing version."""

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from dedup_fixtures import planted_table

from curation import output, schema
from curation.config import DedupConfig
from curation.dedup.index_store import PartitionedNearIndex
from curation.dedup.near import DedupNearConfig
from curation.dedup.steps import DedupContext, DedupNear

CFG = DedupNearConfig(max_distance=4)


def index_dir(out) -> str:
    return output.path(str(out), output.DEDUP_DIR, output.NEAR_INDEX_DIR)


def run(batch: pa.Table, out, against=None, cfg: DedupNearConfig = CFG, version: str | None = None) -> tuple:
    """One run's near dedup as the steps do it (decide, save the index); with ``version`` a finished
    output (manifest, ``_SUCCESS`` naming its dataset id). Returns (decisions, the index searched)."""
    settings = DedupConfig(against=None if against is None else str(against))
    ctx = DedupContext.open(settings, cfg)
    got = DedupNear(cfg, settings).decide(batch, ctx)
    if version is not None:
        ctx.save_index(pafs.LocalFileSystem(), index_dir(out))
        dropped = set(got.column("key").to_pylist())
        keys = batch.column("key").to_pylist()
        (out / output.MANIFEST).mkdir(parents=True)
        pq.write_table(
            pa.table(
                {
                    "key": keys,
                    "sha256": [f"sha-{k}" for k in keys],
                    "status": [schema.DROPPED if k in dropped else schema.KEPT for k in keys],
                }
            ),
            out / output.MANIFEST / "p0.parquet",
        )
        (out / output.SUCCESS_FILE).write_text(json.dumps({"dataset_id": version}))
    return got, ctx.against_index


@pytest.fixture
def chain(tmp_path):
    """Versions v1 <- v2 <- v3 (each deduplicated against the one before) under runs/, a fourth batch,
    and its decisions against v3 where everything was written."""
    table = planted_table(2000, seed=17)
    part = np.random.default_rng(17).integers(0, 4, table.num_rows)
    batches = [table.filter(pa.array(part == i)) for i in range(4)]
    runs = tmp_path / "runs"
    for i in range(3):
        run(batches[i], runs / f"v{i + 1}", against=runs / f"v{i}" if i else None, version=f"id-v{i + 1}")
    want, index = run(batches[3], tmp_path / "v4", against=runs / "v3")
    assert len(index.header["parts"]) == 3 and want.num_rows > 20
    return tmp_path, batches[3], want


def test_a_chain_moved_together_resolves_through_the_relative_hints(chain):
    tmp_path, batch, want = chain
    shutil.move(tmp_path / "runs", tmp_path / "moved")
    got, index = run(batch, tmp_path / "v4", against=tmp_path / "moved" / "v3")
    assert got.equals(want)
    assert index.opened and all(p.startswith(str(tmp_path / "moved") + "/") for p in index.opened)


def test_a_moved_earlier_output_is_named_when_missing_and_found_where_it_is_passed(chain):
    tmp_path, batch, want = chain
    shutil.move(tmp_path / "runs" / "v1", tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=r"of earlier version id-v1 .*dedup\.near\.index_locations") as err:
        run(batch, tmp_path / "v4", against=tmp_path / "runs" / "v3")
    assert "\n" not in str(err.value)
    cfg = DedupNearConfig(max_distance=4, index_locations=(str(tmp_path / "elsewhere"),))
    got, index = run(batch, tmp_path / "v4", against=tmp_path / "runs" / "v3", cfg=cfg, version="id-v4")
    assert got.equals(want)
    v1_files = [p for p in index.opened if p.startswith(str(tmp_path / "elsewhere") + "/")]
    assert v1_files and not [p for p in index.opened if "/runs/v1/" in p]
    # v4's header: every earlier part by its owner, its path there and where it was found now
    v4 = PartitionedNearIndex.open(pafs.LocalFileSystem(), index_dir(tmp_path / "v4"))
    first, second, third, own = v4.header["parts"]
    assert [p["origin"]["version"] for p in (first, second, third)] == ["id-v1", "id-v2", "id-v3"]
    assert first["uri"] == f"{index_dir(tmp_path / 'elsewhere')}/parts/{first['id']}"
    assert first["path"] == f"parts/{first['id']}" and own["uri"] == f"parts/{own['id']}"
    assert first["relative"] == f"../../../elsewhere/_dedup/near_index/parts/{first['id']}"
    # v4 itself moved: its own part relative, the others by the hints it recorded
    shutil.move(tmp_path / "v4", tmp_path / "later" / "v4")
    assert PartitionedNearIndex.open(
        pafs.LocalFileSystem(), index_dir(tmp_path / "later" / "v4")
    ).load().rows.num_rows == sum(p["rows"] for p in v4.header["parts"])


def test_index_locations_must_be_a_list_of_places():
    with pytest.raises(ValueError, match="index_locations"):
        DedupNearConfig(index_locations="runs/v1")
