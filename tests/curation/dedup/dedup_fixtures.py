"""Helpers of the dedup tests: synthetic hash and embedding tables, handmade rows, real photos.

Not a conftest: the Ray fixture is the test-wide ``ray_local`` of ``tests/conftest.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
from PIL import Image

from curation import staging
from curation.dedup.decisions import GlobalDedupInput, partition_decisions
from curation.dedup.hashing import uint64_to_hex
from infra import storage
from tests.conftest import IMAGES

CANDIDATE_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("phash", pa.string()),
        ("phash_mirror", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("person_score_max", pa.float32()),
    ]
)


def flip_bits(value: int, bits) -> int:
    for b in bits:
        value ^= 1 << int(b)
    return value


def planted_table(
    n: int, seed: int = 0, dup_fraction: float = 0.3, max_flips: int = 4, key_prefix: str = "k"
) -> pa.Table:
    """n random 64-bit hashes; a fraction are copies of an earlier row with 0..max_flips bits
    flipped, some of them in the mirror hash (a flipped copy)."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**64, n, dtype=np.uint64).tolist()
    mirrors = rng.integers(0, 2**64, n, dtype=np.uint64).tolist()
    for i in range(1, n):
        if rng.random() < dup_fraction:
            src = int(rng.integers(0, i))
            flipped = flip_bits(hashes[src], rng.choice(64, int(rng.integers(0, max_flips + 1)), replace=False))
            if rng.random() < 0.2:
                mirrors[i] = flipped
            else:
                hashes[i] = flipped
    scores = [None if rng.random() < 0.2 else float(np.float32(rng.random())) for _ in range(n)]
    return pa.table(
        {
            "key": [f"{key_prefix}{i:06d}" for i in range(n)],
            "phash": uint64_to_hex(np.array(hashes, dtype=np.uint64)),
            "phash_mirror": uint64_to_hex(np.array(mirrors, dtype=np.uint64)),
            "width": rng.choice([320, 640, 640, 1024], n).astype(np.int32),
            "height": np.full(n, 480, dtype=np.int32),
            "person_score_max": pa.array(scores, pa.float32()),
        },
        schema=CANDIDATE_SCHEMA,
    )


def shuffled(table: pa.Table, seed: int) -> pa.Table:
    return table.take(np.random.default_rng(seed).permutation(table.num_rows))


def staged_table(root, table: pa.Table, partitions: int, shuffle_partitions: int | None = 3) -> GlobalDedupInput:
    """``table``'s rows staged as a run's scoring leaves them (decoded, no reason yet), spread at
    random over ``partitions`` partitions, as the dedup steps' input."""
    rng = np.random.default_rng(partitions)
    pids = [f"p{i:03d}" for i in range(partitions)]
    n = table.num_rows
    staged = (
        table.append_column("partition", pa.array([pids[i] for i in rng.integers(0, partitions, n)]))
        .append_column("decode_ok", pa.array(np.ones(n, bool)))
        .append_column("reason", pa.nulls(n, pa.string()))
    )
    staging.write_parts(*storage.resolve(str(root)), staged)
    columns = tuple(dict.fromkeys(["key", "partition", *table.column_names]))
    return GlobalDedupInput(str(root), tuple(pids), columns, shuffle_partitions=shuffle_partitions)


def distributed_decisions(root, table: pa.Table, cfg, partitions: int, shuffle_partitions: int | None = 3) -> pa.Table:
    """The distributed engine's (``dedup.engine=ray``) decisions of the one step ``cfg`` sets up
    (near or semantic dedup) on ``table`` staged at ``root``, sorted by key."""
    from curation.dedup.near import DedupNearConfig
    from curation.dedup.steps import DedupContext, DedupNear, DedupSemantic, run_global_dedup

    inp = staged_table(root, table, partitions, shuffle_partitions)
    step = DedupNear(cfg) if isinstance(cfg, DedupNearConfig) else DedupSemantic(cfg)
    run_global_dedup([step], inp, DedupContext(engine="ray"))
    fs, path = storage.resolve(inp.out)
    return pa.concat_tables([partition_decisions(fs, path, pid) for pid in inp.pids]).sort_by("key")


BASE = 0x8F3A_5C21_77D0_1E94


def rows(*specs):
    """(key, hash int, width, height, score[, mirror int]) -> candidate table."""
    out = []
    for i, (key, h, w, ht, score, *mirror) in enumerate(specs):
        m = mirror[0] if mirror else (h ^ (0x5555_5555_5555_5555 + i))  # far from everything
        out.append(
            {
                "key": key,
                "phash": f"{h:016x}",
                "phash_mirror": f"{m:016x}",
                "width": w,
                "height": ht,
                "person_score_max": score,
            }
        )
    return pa.Table.from_pylist(out, schema=CANDIDATE_SCHEMA)


EMB = pa.list_(pa.float32())


def embedding_table(n: int = 800, dim: int = 32, seed: int = 0, dup_fraction: float = 0.3) -> pa.Table:
    """Random unit vectors; a fraction are noisy copies (cosine > 0.995) of an earlier row."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim))
    for i in range(1, n):
        if rng.random() < dup_fraction:
            src = x[rng.integers(0, i)]
            x[i] = src + rng.normal(scale=0.01, size=dim) * np.linalg.norm(src) / np.sqrt(dim)
    return pa.table(
        {
            "key": [f"s{i:05d}" for i in range(n)],
            "width": rng.choice([256, 512], n).astype(np.int32),
            "height": np.full(n, 512, dtype=np.int32),
            "person_score_max": pa.array(rng.random(n), pa.float32()),
            "clip_embedding": pa.array(list(x.astype(np.float32)), EMB),
        }
    )


def real_photos() -> dict[str, Image.Image]:
    import importlib.util

    import matplotlib.cbook
    import skimage.data
    from sklearn.datasets import load_sample_images

    photos = {f.rsplit(".", 1)[0]: Image.open(IMAGES / f).convert("RGB") for f in sorted(os.listdir(IMAGES))}
    bundled = os.path.join(importlib.util.find_spec("ultralytics").submodule_search_locations[0], "assets")
    photos.update({f[:-4]: Image.open(os.path.join(bundled, f)).convert("RGB") for f in ("bus.jpg", "zidane.jpg")})
    photos.update(
        {
            n: Image.fromarray(getattr(skimage.data, n)()).convert("RGB")
            for n in ("astronaut", "camera", "coffee", "chelsea", "rocket")
        }
    )
    photos["grace_hopper"] = Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert(
        "RGB"
    )
    photos.update({f"sklearn_{i}": Image.fromarray(a) for i, a in enumerate(load_sample_images().images)})
    return photos
