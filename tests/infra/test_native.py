"""infra.native: C kernels built once per content and machine, cached, loaded with ctypes; and what
the model does on a machine without a C compiler (the eager layers, with one warning)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra import native

REPO = Path(__file__).resolve().parents[2]
SOURCE = "int hv_test_add(int a, int b) { return a + b; }\n"


@pytest.fixture
def adder(tmp_path) -> Path:
    src = tmp_path / "adder.c"
    src.write_text(SOURCE)
    return src


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HUMANVISION_NATIVE_CACHE", str(tmp_path / "cache"))
    native.load_library.cache_clear()
    yield tmp_path / "cache"
    native.load_library.cache_clear()


def _has_compiler() -> bool:
    try:
        native.compiler()
    except native.NativeBuildError:
        return False
    return True


needs_cc = pytest.mark.skipif(not _has_compiler(), reason="no C compiler on this machine")


@needs_cc
def test_a_library_is_built_once_per_content_and_reused(fresh_cache, adder):
    src = adder
    lib = native.load_library(src)
    assert lib.hv_test_add(2, 3) == 5
    built = list(fresh_cache.glob("adder-*.so"))
    assert len(built) == 1 and not list(fresh_cache.glob("*.tmp"))
    stamp = built[0].stat().st_mtime_ns
    native.load_library.cache_clear()  # a new process: found in the cache, not compiled again
    assert native.load_library(src).hv_test_add(4, 5) == 9
    assert built[0].stat().st_mtime_ns == stamp and len(list(fresh_cache.glob("adder-*.so"))) == 1
    src.write_text(SOURCE.replace("a + b", "a + b + 1"))  # other content: another library
    native.load_library.cache_clear()
    assert native.load_library(src).hv_test_add(4, 5) == 10
    assert len(list(fresh_cache.glob("adder-*.so"))) == 2


@needs_cc
def test_a_source_the_compiler_refuses_is_a_clear_error(fresh_cache, tmp_path):
    src = tmp_path / "broken.c"
    src.write_text("int hv_broken(void) { return undeclared_name; }\n")
    with pytest.raises(native.NativeBuildError, match="broken.c.*undeclared_name"):
        native.load_library(src)
    assert not list(fresh_cache.glob("*"))  # nothing half-written left behind


def test_no_compiler_is_a_clear_error(fresh_cache, adder, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(native.NativeBuildError, match="no C compiler found"):
        native.load_library(adder)


def test_without_a_compiler_the_model_runs_its_eager_layers(tmp_path):
    """A fresh process, an empty kernel cache and no compiler: one warning, and the same
    tokens as with the kernels switched off."""
    script = """
import os, sys, torch
from models import kernels
from models.registry import build_backbone
torch.manual_seed(0)
model = build_backbone("sapiens2_tiny").train()
x = torch.randn(2, 3, 64, 48)
out = model(x).tokens
out.square().mean().backward()
os.environ[kernels.ENV_SWITCH] = "0"
ref = model(x).tokens
print("LIB", kernels._library("qk_norm_rope"), kernels._library("swiglu_backward"), "EQUAL", torch.equal(out, ref))
"""
    env = {
        **os.environ,
        "CC": str(tmp_path / "no-such-cc"),
        "HUMANVISION_NATIVE_CACHE": str(tmp_path / "cache"),
        "PYTHONPATH": str(REPO),
    }
    env.pop("HUMANVISION_NATIVE_KERNELS", None)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LIB None None EQUAL True" in done.stdout
    assert done.stderr.count("unavailable, the eager layers run instead") == 2  # once per kernel, not per call
    assert "no C compiler found" in done.stderr


@needs_cc
def test_the_cache_key_follows_the_machine(fresh_cache, adder, monkeypatch):
    """The build uses -march=native: a library built on one kind of CPU is not loaded on another."""
    native.load_library(adder)
    monkeypatch.setattr(native, "cpu_signature", lambda: "x86_64 model name=another CPU; flags=sse2")
    native.load_library.cache_clear()
    assert native.load_library(adder).hv_test_add(1, 1) == 2
    assert len(list(fresh_cache.glob("adder-*.so"))) == 2


@needs_cc
def test_an_unwritable_cache_is_a_clear_error(fresh_cache, adder, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HUMANVISION_NATIVE_CACHE", str(blocker / "cache"))
    with pytest.raises(native.NativeBuildError, match="cannot build or load"):
        native.load_library(adder)
