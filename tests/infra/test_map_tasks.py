"""``infra.ray_runtime.map_tasks`` on a real local Ray: results in input order, the bound on
pending tasks, a task's exception raised on the driver, a task whose worker dies retried."""

from __future__ import annotations

import os
import signal
import time

import pytest

from infra.ray_runtime import map_tasks


def _square_after(item: tuple[int, float]) -> int:
    i, delay = item
    time.sleep(delay)
    return i * i


def test_results_come_back_in_input_order(ray_local):
    # later items finish first: the order of completion is not the order of the results
    items = [(i, 0.05 if i < 3 else 0.0) for i in range(20)]
    assert map_tasks(_square_after, items, num_cpus=0.5) == [i * i for i in range(20)]
    assert map_tasks(_square_after, [], num_cpus=1) == []


def _interval(_: int) -> tuple[float, float]:
    start = time.time()
    time.sleep(0.05)
    return start, time.time()


def test_at_most_the_bound_is_pending(ray_local):
    # 2 CPUs, 1 CPU a task, 0.5 in flight per CPU: one task at a time, so no two intervals overlap
    spans = sorted(map_tasks(_interval, range(6), num_cpus=1, in_flight_per_cpu=0.5))
    assert all(end <= nxt_start for (_, end), (nxt_start, _) in zip(spans, spans[1:]))


def _fails_on_three(i: int) -> int:
    if i == 3:
        raise ValueError("item 3 is bad")
    return i


def test_an_exception_in_a_task_is_raised(ray_local):
    with pytest.raises(ValueError, match="item 3 is bad"):
        map_tasks(_fails_on_three, range(6), num_cpus=0.5)


def _dies_once(item: tuple[int, str]) -> int:
    i, marker = item
    if i == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # the worker process dies mid-task
    return i + 100


def test_a_task_whose_worker_dies_is_retried(ray_local, tmp_path):
    marker = str(tmp_path / "died")
    assert map_tasks(_dies_once, [(i, marker) for i in range(3)], num_cpus=0.5) == [100, 101, 102]
    assert os.path.exists(marker)  # the first attempt did die
    from ray.exceptions import WorkerCrashedError

    os.remove(marker)
    with pytest.raises(WorkerCrashedError):  # no retries: the death is the map's error
        map_tasks(_dies_once, [(i, marker) for i in range(3)], num_cpus=0.5, max_retries=0)
