"""Keeping freed host memory in a training process instead of handing it back to the OS every step.

PyTorch's CPU tensors come from the C library's ``malloc``. glibc's defaults adapt the
``mmap`` threshold as memory is freed, and give the top of the heap back to the kernel
(``trim``) whenever more than twice that threshold is free there. A CPU training step frees
most of its activations at the end of the backward, so the heap is trimmed and the next
forward grows it again, page by page: every re-touched 4 KiB page is a minor page fault that
the kernel zero-fills. Measured on this project's ``sapiens2_small`` step (256x192, batch 4,
1 thread): ~6,000-10,000 minor faults per step under glibc's defaults, against 0 for the
plain ``nn.TransformerEncoder`` of the same width (its activations stay under the trim
point), and ~1 with the settings below; ``benchmarks/backbone_step.py`` prints the counts
beside the step times.

``retain_freed_memory`` fixes the ``mmap`` threshold at glibc's own upper bound (blocks
below it come from the heap, as the adaptive threshold would have reached) and raises the
trim threshold, so a steady-state step re-uses the pages of the previous one. The cost is
that the process keeps its peak heap resident, which a training process re-uses on the next
step anyway. Only glibc has ``mallopt``; elsewhere (macOS, musl) nothing is changed and the
function says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20
"""glibc's largest ``mmap`` threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``); a larger value is refused."""
DEFAULT_TRIM_THRESHOLD = 1 << 30
"""Free heap top kept before trimming: 1 GiB, above a CPU step's activations at the sizes we train on CPU."""


def retain_freed_memory(trim_threshold: int = DEFAULT_TRIM_THRESHOLD) -> bool:
    """Set glibc's ``malloc`` to keep freed heap memory for re-use (see the module docstring).

    Returns True when both settings were applied, False where the C library is not glibc or
    refused them (the process then runs with the library's defaults, only slower).
    Process-wide: call it once in a process that trains on the CPU.
    """
    if trim_threshold < MMAP_THRESHOLD_MAX:
        raise ValueError(f"trim_threshold must be at least {MMAP_THRESHOLD_MAX} bytes, got {trim_threshold}")
    if platform.libc_ver()[0] != "glibc":
        log.debug("retain_freed_memory: %s has no glibc mallopt; allocator left as it is", platform.system())
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # The trim threshold only after the mmap one: setting either turns glibc's adaptive mmap
    # threshold off, and left at its 128 KiB start every tensor above it would be mmap'd afresh.
    applied = (
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1 and libc.mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1
    )
    if not applied:
        log.warning("retain_freed_memory: glibc refused mallopt; allocator left at its defaults")
    return applied
