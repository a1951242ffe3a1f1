"""A local cluster started by ``init_ray`` runs a Ray Train job without the State API
warning flood (no dashboard locally), and its workers run the setup hook."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import logging, time
    from infra.ray_runtime import PG_CLEANER_LOGGER, init_ray
    init_ray(num_cpus=2)
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    @ray.remote(num_cpus=0.1)
    def level():
        return logging.getLogger(PG_CLEANER_LOGGER).getEffectiveLevel()

    print("worker level", ray.get(level.remote()))

    def loop(_):
        time.sleep(6)  # the cleaner polls every second meanwhile

    TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=1, resources_per_worker={{"CPU": 0.5}}),
                 run_config=RunConfig(storage_path={store!r}, name="quiet")).fit()
    print("trained")
    ray.shutdown()
""")


def test_local_train_job_is_quiet_and_workers_run_the_setup_hook(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(store=str(tmp_path / "store")))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "worker level 40" in text  # logging.ERROR in a worker process
    assert "trained" in text
    assert "Failed to query Ray Train Controller" not in text
