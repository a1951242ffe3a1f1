"""Fixtures of the audit tests: real curation runs of the demo corpus, and headless Chromium.

Three runs of the same corpus: A (the session's curated demo, tests/conftest.py), B (A's
configuration into another folder) and C (A with ``geometry.min_short_side`` raised), B and C
logged to an MLflow store of their own. The browser fixtures are the session's (tests/browser.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from curation.recipe import CurationConfig

MIN_SHORT_SIDE_A, MIN_SHORT_SIDE_C = 256, 500


@dataclasses.dataclass
class Run:
    cfg: CurationConfig
    result: object  # curation.finish.CurationResult

    @property
    def output(self) -> str:
        return self.result.output_dir


@pytest.fixture(scope="session")
def audit_root(demo_curated) -> Path:
    """The session's curated demo's folder (tests/conftest.py): its corpus in ``raw``."""
    return demo_curated[0]


@pytest.fixture(scope="session")
def run_a(demo_curated) -> Run:
    """The session's curated demo: the curation tests' settings, geometry.min_short_side at A's."""
    _, _, cfg, result = demo_curated
    assert cfg.geometry.min_short_side == MIN_SHORT_SIDE_A
    return Run(cfg, result)


@pytest.fixture(scope="session")
def runs_abc(audit_root, run_a) -> tuple[Run, Run, Run]:
    """A; B = A's configuration into another folder; C = A with geometry.min_short_side raised.
    B and C record into an MLflow store of their own: B holds A's version, and in A's store a
    lookup of that id would find B's newer run, not the session's curated demo other tests use."""
    from curation.pipeline import run_curation

    tracking = dataclasses.replace(run_a.cfg.tracking, uri=f"sqlite:///{audit_root / 'mlflow-bc.db'}")
    cfg_b = dataclasses.replace(run_a.cfg, output_dir=str(audit_root / "b"), tracking=tracking)
    geometry_c = dataclasses.replace(run_a.cfg.geometry, min_short_side=MIN_SHORT_SIDE_C)
    cfg_c = dataclasses.replace(run_a.cfg, output_dir=str(audit_root / "c"), geometry=geometry_c, tracking=tracking)
    return run_a, Run(cfg_b, run_curation(cfg_b)), Run(cfg_c, run_curation(cfg_c))
