"""A model step that scores nothing of interest: it records which rows a model step in its place
is given. Each scored chunk leaves two files in ``folder`` (its actors run in other processes):
``<pid>-<id>.started`` before it scores and ``<pid>-<id>.done`` after, each holding the chunk's
keys, so a test can count model calls, see a batch in flight and see it run again. A module of
its own, not a test's: Ray's workers unpickle the step by this importable name."""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from pathlib import Path

import pyarrow as pa

from curation.filters.model import ModelStep, Placement
from curation.recipe import HUMANS1B
from curation.steps import Recipe


@dataclasses.dataclass(kw_only=True)
class CountingConfig(Placement):
    enabled: bool = True
    folder: str = ""  # where the marker files go
    pause_s: float = 0.0  # between a chunk's two markers: a batch in flight long enough to see
    num_cpus: float = 0.0  # beside the detector's and the text filter's fixed pools on 2 CPUs


class ContentCounting(ModelStep):
    """Writes the keys of the rows it scores to ``folder``, before and after (see the module docstring)."""

    section = "content.counting"
    Config = CountingConfig
    reads = ("image",)
    fields = [pa.field("counted", pa.bool_())]

    def setup(self) -> None:
        self.load()

    def load(self) -> None:
        """No model."""

    def score(self, batch: pa.Table, rows: list[int], images: list) -> list[dict]:
        keys = "".join(batch.column("key")[i].as_py() + "\n" for i in rows)
        stem = Path(self.cfg.folder) / f"{os.getpid()}-{uuid.uuid4().hex}"
        stem.with_suffix(".started").write_text(keys)
        time.sleep(self.cfg.pause_s)
        stem.with_suffix(".done").write_text(keys)
        return [{"counted": True} for _ in rows]


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One chunk the step was given: the process that scored it, its keys, whether it finished."""

    stem: str
    pid: int
    keys: tuple[str, ...]
    done: bool


def chunks(folder: Path) -> list[Chunk]:
    """Every chunk started in ``folder`` (a ``.started`` file whose ``.done`` is missing: not finished)."""
    out = []
    for started in sorted(folder.glob("*.started")):
        keys = tuple(started.read_text().split())
        out.append(Chunk(started.stem, int(started.stem.split("-")[0]), keys, started.with_suffix(".done").exists()))
    return out


def _with_counting() -> list:
    """The shipped steps with the counting step right before the detector (first in pass 2)."""
    steps = list(HUMANS1B.steps)
    steps.insert([s.name for s in steps].index("detector"), ContentCounting)
    return steps


COUNTED = Recipe(_with_counting(), job=HUMANS1B.job)


def counted_config(recipe: Recipe, cfg, counting: CountingConfig):
    """``cfg`` (a config of the shipped recipe) in ``recipe``'s config class, with ``counting``."""
    cls = recipe.config_class()
    shared = {f.name: getattr(cfg.content, f.name) for f in dataclasses.fields(cfg.content)}
    content = cls.sections["content"](**shared, counting=counting)
    return cls(
        **{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "content"}, content=content
    )
