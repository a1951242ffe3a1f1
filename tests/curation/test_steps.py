"""Model steps' actor pools: ``ray.actor_pools=fixed`` really starts num_actors actors, and a
local cluster refuses, before any work, fixed pools that would leave no room for the reads."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from curation.steps import Resources, RowStep, apply_step, check_fits


class PidStep(RowStep):
    """A stand-in model step that records which actor process handled each row."""

    section = "pid_model"
    uses_model = True

    def __init__(self, actors: int, cpus: float, started: str = "") -> None:
        super().__init__()
        self.actors, self.cpus, self.started = actors, cpus, started

    def setup(self) -> None:
        if self.started:  # one marker per actor process that was started, whether or not it got rows
            with open(os.path.join(self.started, str(os.getpid())), "w"):
                pass

    def resources(self) -> Resources:
        return Resources(num_cpus=self.cpus, batch_size=4, num_actors=self.actors)

    def process(self, batch: pa.Table) -> pa.Table:
        import time

        time.sleep(0.2)  # long enough that one actor cannot take every batch before the other starts
        return batch.append_column("pid", pa.array([os.getpid()] * batch.num_rows, pa.int64()))


class CheapStep(PidStep):
    section = "cheap"
    uses_model = False


def test_a_fixed_pool_starts_every_actor(ray_local, tmp_path):
    """Counted by the actors that started (Ray Data waits for a pool's minimum size before the
    first batch), not by which actor happened to get rows: that depends on scheduling."""
    import sys

    import ray.data
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

    ds = ray.data.range(64, override_num_blocks=2).map_batches(lambda b: b, batch_format="pyarrow")
    rows = apply_step(ds, PidStep(actors=2, cpus=0.5, started=str(tmp_path))).take_all()
    assert len(rows) == 64 and len(list(tmp_path.iterdir())) == 2


def test_fixed_pools_that_starve_the_reads_are_refused_with_the_settings_to_change():
    steps = [CheapStep(1, 1.0), PidStep(actors=2, cpus=0.875)]
    with pytest.raises(ValueError, match=r"hold 1\.75 of 2 CPUs \(pid_model 2 x 0\.875\).*input\.num_cpus=1"):
        check_fits(steps, read_cpus=1.0, total_cpus=2, autoscale=False)
    with pytest.raises(ValueError, match=r"cheap\.num_cpus=1"):
        check_fits(steps, read_cpus=0.25, total_cpus=2, autoscale=False)
    check_fits([CheapStep(1, 0.25), PidStep(2, 0.75)], read_cpus=0.25, total_cpus=2, autoscale=False)
    check_fits(steps, read_cpus=1.0, total_cpus=2, autoscale=True)  # a growing pool waits for room instead
