"""The contract of one stage of the curate -> pretrain -> [finetune ->] probe chain.

Each stage package has one facade implementing ``Stage`` (``curation.stage.CurateStage``,
``training.stage.PretrainStage``, ``evaluation.finetune.stage.FinetuneStage``,
``evaluation.stage.ProbeStage``); the chain (``pipelines.chain``) calls only these methods and
never spells a stage's config fields or output files itself:

- ``name``: the stage's name in the chain and its workspace folder (``<workspace>/<name>/<identity>``);
- ``script``: the ``pipelines/`` script that runs one placed config as a Ray job;
- ``identity(cfg, upstream)``: what decides reuse, a ``stage_digest`` of the stage's resolved
  settings and of its input's digest ``upstream``;
- ``place(cfg, folder)``: the config writing into ``folder``, local paths made absolute (a Ray
  job runs in a copy of the repo);
- ``run(cfg)``: run (or resume) in this process; returns the result;
- ``result(cfg)``: the result read back from the finished stage's files (after a Ray job).

A result is a ``StageResult`` dataclass: what later stages and the lineage need, and the stage's
own MLflow run. The chain keeps it as the stage folder's ``DONE.json`` (``to_json``) and reads it
back when the stage is reused (``from_json``).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar


def stage_digest(*parts: Any) -> str:
    """The chain's digest of ``parts`` (JSON with sorted keys, sha256, first 16 hex digits).

    Existing workspaces are found by the identities made with it: the recipe must not change."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageResult:
    """What a finished stage hands on. ``run_id``: the MLflow run that produced it."""

    run_id: str | None
    shown: ClassVar[tuple[str, ...]] = ()  # fields the chain's summary prints

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageResult:
        """A result recorded in ``DONE.json``."""
        return cls(**data)

    def summary(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.shown}


C = TypeVar("C")
R = TypeVar("R", bound=StageResult)


class Stage(abc.ABC, Generic[C, R]):
    """One stage of the chain, for configs of type ``C`` and results of type ``R`` (see the module doc)."""

    name: ClassVar[str]
    script: ClassVar[str]
    Result: ClassVar[type[StageResult]]

    @abc.abstractmethod
    def identity(self, cfg: C, upstream: str) -> str:
        """The stage's identity: a ``stage_digest`` of its settings and ``upstream`` (its input's digest)."""

    @abc.abstractmethod
    def place(self, cfg: C, folder: Path) -> C:
        """``cfg`` writing its outputs into ``folder``."""

    @abc.abstractmethod
    def run(self, cfg: C) -> R:
        """Run (or resume) the placed ``cfg`` in this process; its result."""

    @abc.abstractmethod
    def result(self, cfg: C) -> R:
        """The result of the finished stage placed as ``cfg``, read back from its files."""

    def recorded(self, data: dict[str, Any]) -> R:
        """The result recorded in a finished stage's ``DONE.json``."""
        return self.Result.from_json(data)
