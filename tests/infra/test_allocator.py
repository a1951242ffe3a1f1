"""infra.allocator: a training process re-uses freed heap pages instead of faulting them in again.

Each case runs in its own interpreter (the setting is process-wide). The workload frees
~190 MiB of tensors per round, like a CPU training step freeing its activations after the
backward; minor page faults are counted per round with ``getrusage``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from infra.allocator import MMAP_THRESHOLD_MAX, retain_freed_memory

REPO = Path(__file__).resolve().parents[2]
PAGES_PER_ROUND = (160 + 4 * 8) * 256  # 160 x 1 MiB + 4 x 8 MiB tensors, 4 KiB pages

WORKLOAD = """
import json, resource, sys
import torch
applied = None
if sys.argv[1] == "retain":
    from infra.allocator import retain_freed_memory
    applied = retain_freed_memory()
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    live = [torch.ones(256 * 1024) for _ in range(160)] + [torch.ones(2 * 1024 * 1024) for _ in range(4)]
    del live
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def _rounds(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", WORKLOAD, mode],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_retained_memory_is_reused_in_steady_state_where_glibc_defaults_fault_it_in_again():
    retained, default = _rounds("retain"), _rounds("default")
    assert retained["applied"] is True
    # The first round touches every page once either way.
    assert retained["faults"][0] >= 0.9 * PAGES_PER_ROUND
    steady = sum(retained["faults"][3:])
    assert steady < 0.01 * PAGES_PER_ROUND, retained
    # Under glibc's defaults the heap is trimmed after each round and its pages fault in again:
    # the setting is what makes the difference on this workload.
    assert sum(default["faults"][3:]) > 0.1 * PAGES_PER_ROUND, default


def test_a_trim_threshold_below_the_mmap_threshold_is_refused():
    with pytest.raises(ValueError, match="trim_threshold must be at least"):
        retain_freed_memory(MMAP_THRESHOLD_MAX - 1)
