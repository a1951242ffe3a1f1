"""Starting or joining Ray the same way for every job.

Under ``ray job submit`` the job's cluster is joined with a plain ``ray.init()`` (the job
server sets RAY_ADDRESS; a ``runtime_env`` here would conflict with the job's). A plain
``python pipelines/...`` run starts a local cluster, which ends with the script.
"""
from __future__ import annotations

import os
import sys


def joins_a_cluster(address: str | None = None) -> bool:
    """True when ``init_ray(address)`` joins an existing cluster (an address, or ``RAY_ADDRESS``
    set by ``ray job submit``); False when it starts a local one whose size is known."""
    return bool(address or os.environ.get("RAY_ADDRESS"))


def init_ray(address: str | None = None, num_cpus: int | None = None, progress_bars: str = "auto",
             object_store_memory: int | None = None, temp_dir: str | None = None) -> None:
    import ray
    import ray.data

    if not ray.is_initialized():
        if joins_a_cluster(address):
            ray.init(address=address or None, log_to_driver=True)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, object_store_memory=object_store_memory,
                     log_to_driver=True, configure_logging=True, _temp_dir=temp_dir,
                     runtime_env={"worker_process_setup_hook": "infra.ray_runtime.quiet_state_api_pollers"})
    ctx = ray.data.DataContext.get_current()
    show = sys.stderr.isatty() if progress_bars == "auto" else progress_bars == "on"
    ctx.enable_progress_bars = show
    ctx.print_on_execution_start = show


# Ray Train's detached PlacementGroupCleaner asks the State API (served by the dashboard)
# every second whether the train controller is alive. A local cluster started here has no
# dashboard (it costs ~1.6 GB and ~10 s on a laptop), so each poll fails and logs a warning:
# hundreds of identical lines per run. Nothing is lost by hiding them: the cleaner only matters
# if the controller dies without cleaning up, and a local cluster's placement groups end with it.
PG_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def quiet_state_api_pollers() -> None:
    """Worker-process setup hook of a local cluster (see ``init_ray``)."""
    import logging

    logging.getLogger(PG_CLEANER_LOGGER).setLevel(logging.ERROR)
