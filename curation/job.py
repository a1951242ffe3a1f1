"""One curation job prepared: its settings made absolute, its identity and its output folder claimed.

``prepare`` runs every start-up check (the recipe built from the config, weights present)
before any Ray work, digests the job (``job_digest``) and claims the output folder: an empty
one gets the digest, one that holds the same job is resumed, one that holds another is refused.

The job digest is everything that decides the outputs, and nothing else: not where they are
logged, how Ray runs or the resources each step gets, and not where an input lies that enters
by content (model weights and the evaluation set by their bytes, an earlier version by its id).
The input's location is part of it, taken as its real path (a link to the same folder is the
same input). ``config.yaml`` records the settings as the user gave them, local paths made
absolute from the driver's working directory but not resolved through links: what a re-run of
that file reads is what the user named, and the digest refuses it if the bytes changed.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from curation import output
from curation.recipe import HUMANS1B, CurationConfig
from curation.steps import BuiltRecipe, Recipe, section_of
from infra import storage
from infra.config import config_to_dict, dump_config
from infra.digests import sha256_file

# Where and how wide a step runs, never what it decides: a job killed on one cluster shape can
# resume on another (more GPUs, fewer actors) into the same output.
RESOURCE_KEYS = frozenset({"num_cpus", "num_gpus", "num_actors"})
# A step's record of where its threshold was measured (``curation.filters.thresholds``): it
# describes the threshold, it decides nothing, so recording a calibration never makes a new job.
NOT_DECIDING_KEYS = RESOURCE_KEYS | {"calibration"}
NOT_IDENTITY = ("tracking", "ray", "output_dir", "name", "dataset_name")
# A step's settings that name a local file or folder.
PATH_SETTINGS = ("weights", "head_weights", "clip_head_weights", "eval_images")


@dataclasses.dataclass
class CurationJob:
    """One curation job, prepared: its config, built steps, digest and output folder."""

    cfg: Any
    steps: BuiltRecipe
    digest: str
    fs: Any
    root: str

    @property
    def uri(self) -> str:
        return storage.to_uri(self.fs, self.root)


def _deciding(value):
    """The settings that decide outputs: without resources and calibration records, at any depth."""
    if isinstance(value, dict):
        return {k: _deciding(v) for k, v in value.items() if k not in NOT_DECIDING_KEYS}
    return value


def content_digest(path: str) -> dict:
    """A weight file (or a model folder's files) by content: sha256 and size, never its path."""
    p = Path(path).expanduser()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    digests = [
        (
            f.relative_to(p).as_posix() if p.is_dir() else "",
            sha256_file(f),
        )
        for f in files
    ]
    total = sum(f.stat().st_size for f in files)
    one = digests[0][1] if len(digests) == 1 else hashlib.sha256(json.dumps(digests).encode()).hexdigest()
    return {"sha256": one, "bytes": total}


def _local_paths(cfg: CurationConfig, recipe: Recipe, place: Callable[[Path], Path]) -> CurationConfig:
    """A copy of ``cfg`` whose local paths (output, input, the steps' ``PATH_SETTINGS``) are
    ``place``d; URIs with a scheme and empty settings are left as they are."""
    cfg = copy.deepcopy(cfg)
    cfg.output_dir, cfg.input.uri = storage.local_path(cfg.output_dir, place), storage.local_path(cfg.input.uri, place)
    for step in recipe.steps:
        settings = section_of(cfg, step.section) if step.section else None
        for name in PATH_SETTINGS:
            if isinstance(getattr(settings, name, None), str):
                setattr(settings, name, storage.local_path(getattr(settings, name), place))
    return cfg


def absolutize(cfg: CurationConfig, recipe: Recipe = HUMANS1B) -> CurationConfig:
    """Relative local paths (output, input, weights) taken from the driver's working directory,
    before workers see them; links are kept as given (``config.yaml`` records these paths)."""
    return _local_paths(cfg, recipe, Path.absolute)


def job_digest(cfg: CurationConfig, recipe: Recipe = HUMANS1B) -> str:
    """Digest of everything that decides the outputs: not where they are logged, how Ray runs,
    the resources each step gets, nor where the model weights live (they enter by content)."""
    cfg = _local_paths(cfg, recipe, Path.resolve)  # a location by its real path
    d = config_to_dict(cfg)
    for k in NOT_IDENTITY:
        d.pop(k, None)
    d["dedup"]["near"].pop("index_locations", None)  # where earlier index parts lie now: not what the job is
    if not cfg.shards.samples_per_shard:  # one shard per partition: nothing is shuffled, the seed decides nothing
        d["shards"].pop("seed", None)
    if cfg.dedup.against:  # the earlier version by content (its id), not where it lies
        d["dedup"]["against"] = {"dataset_id": output.from_output(cfg.dedup.against).id}
    eval_images = getattr(getattr(cfg.dedup, "decontaminate", None), "eval_images", "")
    if eval_images and "://" not in eval_images:  # the evaluation set by content, not where it lies
        d["dedup"]["decontaminate"]["eval_images"] = content_digest(eval_images)
    for setting, path in recipe.build(cfg).weight_files().items():
        *parents, leaf = setting.split(".")
        node = d
        for p in parents:
            node = node[p]
        node[leaf] = content_digest(path)
    return hashlib.sha256(json.dumps(_deciding(d), sort_keys=True).encode()).hexdigest()[:16]


def prepare(cfg: CurationConfig, recipe: Recipe) -> CurationJob:
    """Checks, digest and the output folder; raises ``ValueError`` before any Ray work."""
    cfg.validate()
    cfg = absolutize(cfg, recipe)
    steps = recipe.build(cfg)
    fs, root = _output_folder(cfg.output_dir)
    job = CurationJob(cfg, steps, job_digest(cfg, recipe), fs, root)
    marker = output.path(root, output.JOB_DIGEST_FILE)
    if storage.exists(fs, marker):
        previous = storage.read_bytes(fs, marker).decode().strip()
        if previous != job.digest:
            raise ValueError(
                f"output_dir {cfg.output_dir!r} holds a run of a different configuration "
                f"(job digest {previous}, this one {job.digest}); use a new output_dir"
            )
    else:
        storage.atomic_write_bytes(fs, marker, job.digest.encode())
    if not storage.exists(fs, output.path(root, output.SUCCESS_FILE)):  # a finished output keeps the config it ran
        storage.atomic_write_bytes(fs, output.path(root, output.CONFIG_FILE), dump_config(cfg).encode())
    return job


def _output_folder(output_dir: str):
    fs, root = storage.resolve(output_dir)
    try:
        storage.makedirs(fs, root)
    except (NotADirectoryError, FileExistsError, PermissionError) as err:
        raise ValueError(
            f"output_dir={output_dir!r} cannot be created ({type(err).__name__}: {err}); "
            "give a folder that can be written"
        ) from None
    return fs, root
