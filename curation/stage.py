"""Curation as one stage of the staged chain (``pipelines.staged``): the chain calls these
functions and never spells curation's config fields or output files itself.

- ``identity(cfg, upstream)``: job digest + curation code version + digest of the input's
  listing (the folder a chain keeps this stage's output in is named by it).
- ``place(cfg, folder)``: the config writing into ``folder``, local paths made absolute.
- ``run(cfg)``: curate in this process; ``result(cfg)``: what the next stage needs, read back
  from the finished output (``curation.output``).
- ``SCRIPT``: the ``pipelines/`` script that runs one stage config as a Ray job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from curation.output import CuratedOutput
from curation.pipeline import absolutize, job_digest, run_curation
from curation.recipe import CurationConfig
from curation.versions import code_version
from infra import storage

SCRIPT = "curate.py"


def _digest(*parts: Any) -> str:
    # The chain's identity recipe (the same in every stage facade): existing workspaces are
    # found by these strings, so the recipe must not change.
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def input_listing_digest(uri: str) -> str:
    """Digest of the raw input's listing (paths and sizes): new, removed or changed files change it."""
    fs, root = storage.resolve(uri)
    return _digest([(f.path, f.size) for f in storage.list_files(fs, root)])


def identity(cfg: CurationConfig, upstream: str = "") -> str:
    """``upstream`` is unused: curation starts the chain, its input is ``cfg.input.uri``,
    which enters the identity through its listing."""
    cfg = absolutize(cfg)
    return _digest("curate", job_digest(cfg), code_version(), input_listing_digest(cfg.input.uri))


def place(cfg: CurationConfig, folder: Path) -> CurationConfig:
    """Local paths absolute: a Ray job runs in a copy of the repo, not in this folder."""
    return dataclasses.replace(absolutize(cfg), output_dir=str(folder))


def run(cfg: CurationConfig) -> dict:
    """Curate (or resume) in this process. Returns nothing beyond what ``result`` reads back."""
    run_curation(cfg)
    return {}


def result(cfg: CurationConfig) -> dict:
    """The finished output's dataset version: what pretraining reads and the lineage names."""
    out = CuratedOutput.at(cfg.output_dir)
    version, stats = out.version(), out.stats()
    return {
        "dataset_id": version.id,
        "dataset_uri": version.uri,
        "shards": list(version.shards),
        "run_id": version.run_id,
        "kept": stats["kept"],
        "inputs": stats["inputs"],
    }
