"""Thumbnails of the explorer: made on demand by the static audit's code, cached on disk.

A thumbnail is made from a manifest row the explorer looked up by its key, never from a path
in a request: a kept image from the version's own shards, a dropped one from the source its row
records (``images.tiles``: decoded with the run's decode settings, person boxes drawn by the
run's box rule, one read per container). Made thumbnails are cached in the version's cache
folder under the SHA-1 of the key and the size (a key may hold any character), written to a
temporary name and renamed. An input that cannot be shown (an error row, a source that is gone
or unreadable) gets a placeholder image naming why; placeholders are not cached, so a source
that comes back is shown the next time.
"""

from __future__ import annotations

import io
import os
import textwrap
from pathlib import Path

from PIL import Image, ImageDraw

from curation.audit import images
from curation.audit.loading import AuditedVersion

SIDES = (images.THUMB_SIDE, 640)  # the galleries' and the image page's


def placeholder_jpeg(text: str, side: int) -> bytes:
    """A JPEG ``side`` wide saying ``text`` (why there is no thumbnail)."""
    im = Image.new("RGB", (side, max(60, side * 3 // 4)), "#fde8e8")
    draw = ImageDraw.Draw(im)
    lines = textwrap.wrap(text, width=max(12, side // 7))[: max(1, im.height // 14 - 1)]
    draw.multiline_text((6, 6), "\n".join(lines), fill="#8a1c1c", spacing=3)
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=images.JPEG_QUALITY)
    return buf.getvalue()


class ThumbnailCache:
    """``jpeg(row, side)`` for the rows of one version, cached in ``folder``."""

    def __init__(self, v: AuditedVersion, folder: Path) -> None:
        self.v, self.folder = v, folder
        folder.mkdir(parents=True, exist_ok=True)

    def path(self, key: str, side: int) -> Path:
        return self.folder / f"{images.sample_order(key)}-{side}.jpg"

    def jpeg(self, row: dict, side: int) -> tuple[bytes, str | None]:
        """(JPEG bytes, None) of ``row``'s image at most ``side`` long, or (a placeholder, why).
        ``row`` needs ``explore_query.THUMB_COLUMNS``."""
        if side not in SIDES:
            raise ValueError(f"thumbnail side {side} is not one of {SIDES}")
        path = self.path(row["key"], side)
        if path.is_file():
            return path.read_bytes(), None
        (tile,) = images.tiles(
            [row], lambda r: [], config=self.v.config, stats=self.v.stats, output_uri=self.v.uri, side=side
        )
        if tile.jpeg is None:
            return placeholder_jpeg(tile.placeholder, side), tile.placeholder
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(tile)}.tmp")
        tmp.write_bytes(tile.jpeg)
        os.replace(tmp, path)
        return tile.jpeg, None
