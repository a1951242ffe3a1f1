"""Filesystem access for local paths and object-store URIs (``s3://``, ``gs://``, ...) via pyarrow.fs.

Outputs are committed atomically: on a local or POSIX filesystem a file is written under a
temporary name in the same folder and renamed when complete; on object stores a single
PUT is already all-or-nothing, so the object is written in place. Readers never see a
half-written file, and ``remove_temp_files`` clears what a killed job left behind.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow.fs as pafs

TMP_INFIX = ".tmp-"


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or a URI with a scheme."""
    if "://" in uri and not uri.startswith("file://"):
        return pafs.FileSystem.from_uri(uri)
    path = uri[len("file://") :] if uri.startswith("file://") else uri
    return pafs.LocalFileSystem(), str(Path(path).expanduser().resolve())


def is_local(fs: pafs.FileSystem) -> bool:
    return isinstance(fs, pafs.LocalFileSystem)


def local_path(path: str, place: Callable[[Path], Path] = Path.resolve) -> str:
    """A config's path setting made absolute for workers that run elsewhere: ``~`` expanded, then
    ``place`` (``Path.resolve``: links resolved; ``Path.absolute``: kept as given). "" (unset) and
    URIs with a scheme (``s3://``, ``file://``) are returned as they are."""
    return path if not path or "://" in path else str(place(Path(path).expanduser()))


def join(base: str, *parts: str) -> str:
    return posixpath.join(base, *parts)


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def makedirs(fs: pafs.FileSystem, path: str) -> None:
    fs.create_dir(path, recursive=True)


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()


def atomic_write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that the file appears complete or not at all."""
    parent = posixpath.dirname(path)
    if parent:
        fs.create_dir(parent, recursive=True)
    if not is_local(fs):
        with fs.open_output_stream(path) as f:
            f.write(data)
        return
    tmp = f"{posixpath.dirname(path)}/.{posixpath.basename(path)}{TMP_INFIX}{uuid.uuid4().hex[:8]}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def list_files(
    fs: pafs.FileSystem, root: str, suffixes: tuple[str, ...] | None = None, recursive: bool = True
) -> list[pafs.FileInfo]:
    """Files under ``root`` (sorted by path), optionally only those ending in ``suffixes`` (case-insensitive)."""
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        raise ValueError(f"input {root!r} does not exist")
    if info.type == pafs.FileType.File:
        files = [info]
    else:
        files = [
            f for f in fs.get_file_info(pafs.FileSelector(root, recursive=recursive)) if f.type == pafs.FileType.File
        ]
    files = [f for f in files if TMP_INFIX not in f.base_name and not f.base_name.startswith(".")]
    if suffixes:
        lowered = tuple(s.lower() for s in suffixes)
        files = [f for f in files if f.base_name.lower().endswith(lowered)]
    return sorted(files, key=lambda f: f.path)


def remove_temp_files(fs: pafs.FileSystem, root: str) -> int:
    """Delete temporary files a killed job left under ``root``; returns how many."""
    if not exists(fs, root):
        return 0
    removed = 0
    for f in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if f.type == pafs.FileType.File and TMP_INFIX in f.base_name:
            fs.delete_file(f.path)
            removed += 1
    return removed


def to_uri(fs: pafs.FileSystem, path: str) -> str:
    """A URI other processes can open: plain absolute paths stay paths."""
    if is_local(fs):
        return path
    return f"{fs.type_name}://{path}"


class atomic_output:
    """Context manager giving a writable stream whose file appears at ``path`` only on success."""

    def __init__(self, fs: pafs.FileSystem, path: str) -> None:
        self.fs, self.path = fs, path
        parent = posixpath.dirname(path)
        self.tmp = f"{parent}/.{posixpath.basename(path)}{TMP_INFIX}{uuid.uuid4().hex[:8]}" if is_local(fs) else path

    def __enter__(self):
        parent = posixpath.dirname(self.path)
        if parent:
            self.fs.create_dir(parent, recursive=True)
        self.stream = self.fs.open_output_stream(self.tmp)
        return self.stream

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stream.close()
        if exc_type is not None:
            if self.tmp != self.path and exists(self.fs, self.tmp):
                self.fs.delete_file(self.tmp)
            return
        if self.tmp != self.path:
            os.replace(self.tmp, self.path)


def write_parquet(fs: pafs.FileSystem, path: str, table, *, stored: tuple[str, ...] = ()) -> None:
    """Atomic Parquet write with settings fixed so equal tables give equal bytes. Columns in
    ``stored`` (already-compressed payloads such as JPEG bytes) are written uncompressed and
    without statistics: compressing them again costs CPU and saves nothing."""
    import pyarrow.parquet as pq

    compression = {c: ("none" if c in stored else "zstd") for c in table.column_names} if stored else "zstd"
    statistics = [c for c in table.column_names if c not in stored] if stored else True
    with atomic_output(fs, path) as out:
        pq.write_table(table, out, compression=compression, write_statistics=statistics)


def write_tar_members(fs: pafs.FileSystem, path: str, members: Iterable[tuple[str, bytes]]) -> None:
    """A tar (GNU format) of ``(name, bytes)`` members in the order given, written atomically. Every
    member has the same metadata (mtime 0, mode 0644, uid/gid 0, no owner names), so the same
    members give the same bytes on any machine."""
    with atomic_output(fs, path) as out, tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
