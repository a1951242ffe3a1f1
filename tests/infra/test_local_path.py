"""``infra.storage.local_path``: the one rule every stage's ``absolutize`` applies to its path settings."""

from __future__ import annotations

from pathlib import Path

from infra.storage import local_path


def test_relative_paths_become_absolute_and_uris_and_unset_stay(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert local_path("link/w.pt") == str((tmp_path / "real" / "w.pt").resolve())
    assert local_path("link/w.pt", Path.absolute) == str(Path.cwd() / "link" / "w.pt")
    assert local_path("~/link") == str((tmp_path / "real").resolve())
    for kept in ("", "s3://bucket/data?endpoint_override=127.0.0.1:9000", "file:///data/x"):
        assert local_path(kept) == kept
