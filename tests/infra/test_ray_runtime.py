"""A local cluster started by ``init_ray`` runs a Ray Train job without the State API
warning flood (no dashboard locally), its workers run the setup hook, and its datasets shuffle
with tasks (``ray.shuffle=auto``); ``use_shuffle`` sets and restores Ray Data's strategy."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import logging, time
    from infra.ray_runtime import PG_CLEANER_LOGGER, init_ray
    init_ray(num_cpus=2)
    import ray
    import ray.data
    print("shuffle", ray.data.DataContext.get_current().shuffle_strategy.value)
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


@pytest.mark.slow
def test_local_train_job_is_quiet_and_workers_run_the_setup_hook(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(store=str(tmp_path / "store")))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "worker level 40" in text  # logging.ERROR in a worker process
    assert "trained" in text
    assert "shuffle sort_shuffle_pull_based" in text
    assert "Failed to query Ray Train Controller" not in text


def test_use_shuffle_sets_sort_restores_rays_default_and_refuses_another_name():
    import ray.data
    from ray.data.context import ShuffleStrategy

    from infra.ray_runtime import use_shuffle

    ctx = ray.data.DataContext.get_current()
    before = ctx.shuffle_strategy
    try:
        use_shuffle("sort")
        assert ctx.shuffle_strategy == ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
        use_shuffle("hash")
        assert ctx.shuffle_strategy == type(ctx)().shuffle_strategy != ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
        with pytest.raises(ValueError, match="ray.shuffle must be auto, sort or hash, got 'push'"):
            use_shuffle("push")
    finally:
        ctx.shuffle_strategy = before
