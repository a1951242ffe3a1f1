"""Starting or joining Ray the same way for every job.

Under ``ray job submit`` the job's cluster is joined with a plain ``ray.init()`` (the job
server sets RAY_ADDRESS; a ``runtime_env`` here would conflict with the job's). A plain
``python pipelines/...`` run starts a local cluster, which ends with the script.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Literal


@dataclasses.dataclass(kw_only=True)
class RayConfig:
    """The ``ray`` section of every stage's config: one set of keys, each stage using its part.

    Cluster (all stages): ``address`` (None: the job's cluster under ``ray job submit``, else a
    local one), and for a local cluster ``num_cpus``, ``object_store_memory``, ``temp_dir``.
    Ray Data (curation): ``progress_bars``, ``actor_pools``, ``shuffle``. Ray Train (pretraining, probing):
    ``num_workers``, ``cpus_per_worker``, ``use_gpu``, ``max_failures``, ``timeout_s``.
    Stages set their own defaults with ``ray_section(...)``.
    """

    address: str | None = None
    num_cpus: int | None = None  # local cluster only
    object_store_memory: int | None = None  # local cluster only, bytes
    temp_dir: str | None = None  # local cluster only: Ray's session folder root (short path)
    progress_bars: Literal["auto", "on", "off"] = "auto"  # auto: on when the terminal is interactive
    # Model steps' actor pools: "fixed" starts every one of a step's num_actors at once (Ray Data
    # left to grow a pool kept one actor busy: docs/results/curation_throughput.md); "autoscaling"
    # starts one and lets Ray Data add up to num_actors.
    actor_pools: Literal["fixed", "autoscaling"] = "fixed"
    # How Ray Data's groupby shuffles (the dedup steps, shard assignment): "sort" runs map and
    # reduce tasks, "hash" Ray's default (aggregator actors started for each shuffle, slow on a
    # small machine: docs/results/test_loop.md), "auto" sort on a local cluster started here and
    # Ray's default on a cluster joined.
    shuffle: Literal["auto", "sort", "hash"] = "auto"
    num_workers: int = 1  # Ray Train workers
    cpus_per_worker: float = 1.0  # < 1 lets two workers share a small machine
    use_gpu: bool = False
    max_failures: int = 3  # Ray Train restarts after a worker failure
    timeout_s: int = 1800  # Ray Train: how long to wait for the workers' resources

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"ray.num_workers must be >= 1, got {self.num_workers}")
        if self.cpus_per_worker <= 0:
            raise ValueError(f"ray.cpus_per_worker must be > 0, got {self.cpus_per_worker}")


def ray_section(**defaults: Any) -> Any:
    """A dataclass ``field`` for a stage config's ``ray`` section with that stage's defaults."""
    return dataclasses.field(default_factory=lambda: RayConfig(**defaults))


def joins_a_cluster(address: str | None = None) -> bool:
    """True when ``init_ray(address)`` joins an existing cluster (an address, or ``RAY_ADDRESS``
    set by ``ray job submit``); False when it starts a local one whose size is known."""
    return bool(address or os.environ.get("RAY_ADDRESS"))


def start_ray(cfg: RayConfig) -> None:
    """``init_ray`` from a stage's ``ray`` section."""
    init_ray(cfg.address, cfg.num_cpus, cfg.progress_bars, cfg.object_store_memory, cfg.temp_dir, cfg.shuffle)


def init_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    progress_bars: str = "auto",
    object_store_memory: int | None = None,
    temp_dir: str | None = None,
    shuffle: str = "auto",
) -> None:
    import ray
    import ray.data

    joins = joins_a_cluster(address)
    if not ray.is_initialized():
        if joins:
            ray.init(address=address or None, log_to_driver=True)
        else:
            ray.init(
                num_cpus=num_cpus,
                include_dashboard=False,
                object_store_memory=object_store_memory,
                log_to_driver=True,
                configure_logging=True,
                _temp_dir=temp_dir,
                runtime_env={"worker_process_setup_hook": "infra.ray_runtime.quiet_state_api_pollers"},
            )
    ctx = ray.data.DataContext.get_current()
    show = sys.stderr.isatty() if progress_bars == "auto" else progress_bars == "on"
    ctx.enable_progress_bars = show
    ctx.print_on_execution_start = show
    if shuffle == "auto":
        shuffle = "hash" if joins else "sort"
    use_shuffle(shuffle)


def use_shuffle(mode: str) -> None:
    """Ray Data's shuffle for this driver's datasets (``RayConfig.shuffle``: "sort" or "hash")."""
    import ray.data
    from ray.data.context import ShuffleStrategy

    if mode not in ("sort", "hash"):
        raise ValueError(f"ray.shuffle must be auto, sort or hash, got {mode!r}")
    ctx = ray.data.DataContext.get_current()
    default = type(ctx)().shuffle_strategy  # Ray's own default (its hash-based shuffle)
    ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED if mode == "sort" else default


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


# ---- per-item work as plain Ray tasks --------------------------------------------------


def _call(fn, item):
    return fn(item)


def map_tasks(
    fn, items, *, num_cpus: float = 1.0, max_retries: int = 3, name: str = "map_tasks", in_flight_per_cpu: float = 2.0
) -> list:
    """``[fn(item) for item in items]``, each call a Ray task needing ``num_cpus``; results in order.

    For work that is one independent task per item with nothing streamed between operators
    (a partition's read + cheap stages + staging write, a partition's shard, a manifest part's
    summary). Ray Data's streaming executor starts such tasks slowly and leaves a gap between
    one task's end and the next one's start (it polls for completions and leases a worker per
    task); tasks queued at Ray start as soon as a CPU frees, the lease reused (the timeline:
    ``docs/results/curation_throughput.md``, "pass 1 as Ray tasks"). At most
    ``in_flight_per_cpu`` x the cluster's CPUs / ``num_cpus`` tasks are pending at once, so the
    driver holds refs in proportion to the cluster, not to ``items``.

    A task whose worker dies is retried by Ray (``max_retries``), so ``fn`` must be idempotent;
    an exception raised by ``fn`` ends the map with that exception.
    """
    import ray

    items = list(items)
    if not items:
        return []
    remote = ray.remote(_call).options(num_cpus=num_cpus, max_retries=max_retries, name=name)
    fn_ref = ray.put(fn)
    cpus = max(ray.cluster_resources().get("CPU", 1.0), num_cpus)
    limit = max(1, int(in_flight_per_cpu * cpus / num_cpus)) if num_cpus > 0 else len(items)
    results: list = [None] * len(items)
    pending: dict = {}
    todo = iter(range(len(items)))

    def fill() -> None:
        for i in todo:
            pending[remote.remote(fn_ref, items[i])] = i
            if len(pending) >= limit:
                return

    fill()
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            results[pending.pop(ref)] = ray.get(ref)
        fill()
    return results
