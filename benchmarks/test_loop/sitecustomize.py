"""Start-up events of every Python process of a test run, for ``benchmarks/test_loop/count_starts.py``.

Python imports ``sitecustomize`` at start-up from ``PYTHONPATH``; that script puts this folder
first on the ``PYTHONPATH`` of the pytest it runs, so the test process, the job processes it
starts, their Ray daemons and workers (they inherit the environment) all run this. With
``HV_COST_LOG`` unset it does nothing. With it set, it appends one JSON line per event there:

- ``process``: this process started (pid, parent pid, ``sys.argv``);
- ``ray_cluster``: this process starts a Ray head node (``ray.init()`` without an address, or
  ``ray start --head``): ``ray._private.node.Node(head=True)``;
- ``ray_train``: this process launches a Ray Train run (``DataParallelTrainer.fit``, which
  ``TorchTrainer`` inherits).

Nothing of the code under test is changed: the two classes are wrapped when Ray imports them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

LOG = os.environ.get("HV_COST_LOG")


def record(kind: str, **fields) -> None:
    line = json.dumps({"kind": kind, "t": time.time(), "pid": os.getpid(), **fields}) + "\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write of a short line: appends from many processes do not interleave
    finally:
        os.close(fd)


def _wrap_node(module) -> None:
    init = module.Node.__init__

    def __init__(self, ray_params, head: bool = False, *args, **kwargs):
        if head:
            record("ray_cluster")
        init(self, ray_params, head, *args, **kwargs)

    module.Node.__init__ = __init__


def _wrap_trainer(module) -> None:
    fit = module.DataParallelTrainer.fit

    def wrapped(self):
        record("ray_train", name=getattr(self.run_config, "name", None))
        return fit(self)

    module.DataParallelTrainer.fit = wrapped


WRAPS = {"ray._private.node": _wrap_node, "ray.train.v2.api.data_parallel_trainer": _wrap_trainer}


class _Wrapper(importlib.abc.MetaPathFinder):
    """Finds the modules of ``WRAPS`` as usual and wraps their class once they are executed."""

    def find_spec(self, name, path, target=None):
        if name not in WRAPS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            WRAPS[name](module)

        spec.loader.exec_module = exec_module
        return spec


if LOG:
    record("process", ppid=os.getppid(), argv=list(sys.argv))
    sys.meta_path.insert(0, _Wrapper())
