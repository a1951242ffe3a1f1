"""Small C kernels built on the machine that runs them, cached by content, loaded with ``ctypes``.

For CPU hot paths that eager PyTorch runs as many passes over memory and that have no library
kernel (see ``models.kernels``). A kernel is one self-contained C file with plain C functions
over raw pointers: it compiles in well under a second with the system C compiler and needs no
PyTorch headers. The shared library is cached under ``$HUMANVISION_NATIVE_CACHE`` (default
``$XDG_CACHE_HOME/humanvision/native``, else ``~/.cache/humanvision/native``), named by the
SHA-256 of the source, the compiler's version, the flags and this CPU's model and feature flags
(the build uses ``-march=native``, so a library is only ever loaded on the kind of CPU that built
it). Concurrent builders (Ray workers starting together) each compile to a private temporary file
and rename it into place, so a reader never sees a half-written library.

Callers decide what a failed build means: ``NativeBuildError`` names the compiler and its output.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = (
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fPIC",
    "-shared",
    "-std=c11",
)
"""``-ffp-contract=off``: no fused multiply-add, so every rounding of the source happens as written."""
OPENMP_FLAG = "-fopenmp"


class NativeBuildError(RuntimeError):
    """No C compiler, or the compiler refused the source."""


def cache_dir() -> Path:
    explicit = os.environ.get("HUMANVISION_NATIVE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "humanvision" / "native"


def compiler() -> str:
    """The C compiler: ``$CC``, else the first of cc, gcc, clang on PATH."""
    found = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if not found or not shutil.which(found.split()[0]):
        raise NativeBuildError(f"no C compiler found (CC={os.environ.get('CC')!r}; none of cc, gcc, clang on PATH)")
    return found


@functools.cache
def _compiler_version(cc: str) -> str:
    try:
        done = subprocess.run([*cc.split(), "--version"], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        raise NativeBuildError(f"cannot run the C compiler {cc!r}: {exc}") from exc
    return done.stdout.strip()


@functools.cache
def cpu_signature() -> str:
    """The CPU's model and feature flags (Linux ``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    keep = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    first = {}
    for line in lines:
        key, _, value = line.partition(":")
        key = key.strip()
        if key in keep and key not in first:
            first[key] = " ".join(sorted(value.split())) if key in ("flags", "Features") else value.strip()
    return f"{platform.machine()} " + "; ".join(f"{k}={first[k]}" for k in sorted(first))


def _compile(cc: str, source: Path, target: Path, flags: tuple[str, ...]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [*cc.split(), *flags, str(source), "-o", tmp], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise NativeBuildError(
                f"{cc} failed on {source.name} (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}"
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def load_library(source: Path, *, openmp: bool = True) -> ctypes.CDLL:
    """Build ``source`` (once per content, compiler and CPU; see the module docstring) and load it.

    With ``openmp`` the build first tries ``-fopenmp`` and, where the compiler has no OpenMP,
    builds without it (the kernels then run on one thread). Raises ``NativeBuildError``.
    """
    cc = compiler()
    text = source.read_bytes()
    attempts = [(*FLAGS, OPENMP_FLAG), FLAGS] if openmp else [FLAGS]
    errors = []
    for flags in attempts:
        key = hashlib.sha256(
            b"\0".join([text, _compiler_version(cc).encode(), " ".join(flags).encode(), cpu_signature().encode()])
        ).hexdigest()[:20]
        target = cache_dir() / f"{source.stem}-{key}.so"
        try:
            if not target.exists():
                _compile(cc, source, target, flags)
            return ctypes.CDLL(str(target))
        except NativeBuildError as exc:
            errors.append(str(exc))
        except OSError as exc:  # an unwritable cache folder, a noexec mount, a library the loader refuses
            errors.append(f"cannot build or load {target}: {exc}")
    raise NativeBuildError("; ".join(errors))
