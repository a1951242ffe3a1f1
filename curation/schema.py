"""Row layout of the curation pipeline: column names, statuses and reasons, in one place.

Every input image is one row from the reader onwards. Row steps add columns and may set
``reason`` on a row that is still pending; nothing is removed until the pipeline's single
decision point (``final_status``), so every input ends in the manifest exactly once with
status ``kept``, ``dropped`` or ``error`` and, for the last two, its reason.

Row columns written by the reader and the decode step (the base schema):

- ``partition``: id of the input partition the row came from (also its output shard's name).
- ``key``: stable sample key (unique within a run; safe as a WebDataset key: no dots).
- ``source``: URI of the input (file path, ``tar_uri#member`` or ``parquet_uri#row=N``).
- ``source_meta``: JSON/text that came with the input (img2dataset ``.json``/``.txt``), or null.
- ``input_bytes``: size of the input file in bytes.
- ``sha256``: SHA-256 of the input bytes (exact dedup).
- ``decode_ok``: false when the input could not be used as an image.
- ``reason``: null while a row is pending; else the error or drop reason that ended it.
- ``error_message``: text of the exception behind an error reason.
- ``width``/``height``: size of the normalised image (after EXIF orientation).
- ``format``/``mode``: source container format and Pillow mode.
- ``notes``: what decode did on purpose (``exif_rotated``, ``animated_frame0``, ...).
- ``converted``: the pixels come from a deliberate conversion of the source encoding (palette,
  greyscale, 16-bit scaled, CMYK, alpha-composited, animated frame 0): a derived copy, which a
  duplicate family's representative rule ranks below an original encoding.
- ``image``: the normalised image as encoded bytes (JPEG), null for errors.
- ``image_ext``: extension of ``image`` in the shards (``jpg``).
- ``phash``/``phash_mirror``: 64-bit perceptual hash (imagededup's PHash algorithm) of the
  image and of its mirror, as 16 hex characters.
- ``bytes_uri``/``bytes_offset``: where the input's bytes can be read again (a file, or an
  uncompressed tar at the member's offset; ``input_bytes`` long), null when they cannot (Parquet
  byte columns, compressed tars) or when the image was re-encoded. Staging then stores no image
  bytes for the row: pass 2 and the shard writer read them from there by reference, checked
  against ``sha256`` (``curation.staging.load_image_bytes``). Never written to the manifest.

Transient columns (``TRANSIENT_FIELDS``) live only inside pass 1's read task, for the cheap
steps there; staging drops them, so no later pass, the manifest or the shards ever hold them:

- ``thumbnail``: decode's 8-bit grey thumbnail (``width``, ``height``, ``luma``: row-major bytes),
  short side ``curation.decode.THUMBNAIL_SIDE``, reduced from the pixels the PHash is computed
  from (for a JPEG kept as it is, its reduced-scale draft decode): what sharpness and exposure
  are measured on without decoding the image again.
"""

from __future__ import annotations

import pyarrow as pa

KEPT, DROPPED, ERROR = "kept", "dropped", "error"
STATUSES = (KEPT, DROPPED, ERROR)

# Error reasons: the input could not be read or decoded. Each bad-file kind has its own.
READ_FAILED = "read_failed"  # the bytes could not be fetched from storage
DOWNLOAD_FAILED = "download_failed"  # the gatherer (img2dataset) recorded a failed download: no bytes exist
EMPTY_FILE = "empty_file"  # zero bytes
FILE_TOO_LARGE = "file_too_large"  # more bytes than decode.max_bytes (not read into memory)
NOT_AN_IMAGE = "not_an_image"  # Pillow cannot identify the bytes as any image format
DECOMPRESSION_BOMB = "decompression_bomb"  # header declares more pixels than decode.max_pixels
TRUNCATED = "truncated"  # image data ends early (caught by a full load)
DECODE_FAILED = "decode_failed"  # any other decoder failure
UNSUPPORTED_MODE = "unsupported_mode"  # a pixel mode we cannot convert to RGB on purpose
ERROR_REASONS = (
    DOWNLOAD_FAILED,
    READ_FAILED,
    EMPTY_FILE,
    FILE_TOO_LARGE,
    NOT_AN_IMAGE,
    DECOMPRESSION_BOMB,
    TRUNCATED,
    DECODE_FAILED,
    UNSUPPORTED_MODE,
)

# Drop reasons owned by the core steps (content filters and dedup add their own).
TOO_SMALL = "too_small"
BAD_ASPECT_RATIO = "aspect_ratio"
NO_SALIENT_PERSON = "no_salient_person"
EXACT_DUPLICATE = "exact_duplicate"
NEAR_DUPLICATE = "near_duplicate"
SEMANTIC_DUPLICATE = "semantic_duplicate"

BASE_FIELDS = [
    pa.field("partition", pa.string(), nullable=False),
    pa.field("key", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("source_meta", pa.string()),
    pa.field("input_bytes", pa.int64()),
    pa.field("sha256", pa.string()),
    pa.field("decode_ok", pa.bool_()),
    pa.field("reason", pa.string()),
    pa.field("error_message", pa.string()),
    pa.field("width", pa.int32()),
    pa.field("height", pa.int32()),
    pa.field("format", pa.string()),
    pa.field("mode", pa.string()),
    pa.field("notes", pa.list_(pa.string())),
    pa.field("converted", pa.bool_()),
    pa.field("image", pa.binary()),
    pa.field("image_ext", pa.string()),
    pa.field("phash", pa.string()),
    pa.field("phash_mirror", pa.string()),  # PHash of the horizontal mirror: flipped copies are near-duplicates
    pa.field("bytes_uri", pa.string()),
    pa.field("bytes_offset", pa.int64()),
]

# The reader's raw rows, before decode.
RAW_FIELDS = [
    pa.field("partition", pa.string(), nullable=False),
    pa.field("key", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("source_meta", pa.string()),
    pa.field("input_bytes", pa.int64()),
    pa.field("raw", pa.binary()),
    pa.field("reason", pa.string()),
    pa.field("error_message", pa.string()),
    pa.field("bytes_uri", pa.string()),
    pa.field("bytes_offset", pa.int64()),
]
RAW_SCHEMA = pa.schema(RAW_FIELDS)

PERSON_FIELDS = [
    pa.field("person_boxes", pa.list_(pa.list_(pa.float32(), 4))),  # x1, y1, x2, y2 in image pixels
    pa.field("person_scores", pa.list_(pa.float32())),
    pa.field("person_count", pa.int32()),  # boxes with score >= the detector threshold
    pa.field("salient_person_count", pa.int32()),  # ... that are also large enough
    pa.field("person_score_max", pa.float32()),
    pa.field("person_max_area", pa.float32()),  # the largest of those boxes' area / the image's area; 0 if none
]

# Columns the final decision adds to every manifest row.
DECISION_FIELDS = [
    pa.field("status", pa.string(), nullable=False),
    pa.field("duplicate_of", pa.string()),  # key of the kept representative, for duplicates
    pa.field("duplicate_group", pa.string()),
    pa.field("shard", pa.string()),  # shard file name for kept rows
]

THUMBNAIL_TYPE = pa.struct(
    [pa.field("width", pa.int32()), pa.field("height", pa.int32()), pa.field("luma", pa.binary())]
)
# Written in pass 1 for the steps of its read task only; never staged (see the module doc).
TRANSIENT_FIELDS = [pa.field("thumbnail", THUMBNAIL_TYPE)]
TRANSIENT_COLUMNS = tuple(f.name for f in TRANSIENT_FIELDS)

# Columns never copied into the manifest (image payloads live in the shards only).
PAYLOAD_COLUMNS = ("image", "raw")
# Where the payload can be read again (staging only): never copied into the manifest or the shards.
REFERENCE_COLUMNS = ("bytes_uri", "bytes_offset")
# Image embeddings (list<float32>, L2-normalised), preferred first: kept in the manifest and the
# sidecars, too bulky for a sample's json or a row shown to a person.
EMBEDDING_COLUMNS = ("clip_embedding", "backbone_embedding")


def pending_mask(table: pa.Table) -> list[bool]:
    """Rows that decoded and that no step has ended yet: the ones a step should score."""
    ok = table.column("decode_ok").to_pylist()
    reasons = table.column("reason").to_pylist()
    return [bool(o) and r is None for o, r in zip(ok, reasons)]


def with_columns(table: pa.Table, columns: dict[str, pa.Array | list]) -> pa.Table:
    """Set or add columns, keeping the table's other columns and their order."""
    for name, values in columns.items():
        arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
        idx = table.schema.get_field_index(name)
        table = table.set_column(idx, name, arr) if idx >= 0 else table.append_column(name, arr)
    return table


def typed_columns(table: pa.Table, fields: list[pa.Field], values: dict[str, list]) -> pa.Table:
    """Set ``values`` (python lists, one per field) with the declared arrow types."""
    return with_columns(table, {f.name: pa.array(values[f.name], type=f.type) for f in fields})


def set_reasons(table: pa.Table, reasons: list[str | None]) -> pa.Table:
    """Give pending rows a reason where ``reasons`` has one; rows already ended keep theirs."""
    current = table.column("reason").to_pylist()
    merged = [old if old is not None else new for old, new in zip(current, reasons)]
    return with_columns(table, {"reason": pa.array(merged, type=pa.string())})


def final_status(decode_ok: bool | None, reason: str | None) -> str:
    """The pipeline's single decision: error (the bytes are unusable), dropped (a filter said so) or kept."""
    if not decode_ok or reason in ERROR_REASONS:
        return ERROR
    return DROPPED if reason is not None else KEPT
