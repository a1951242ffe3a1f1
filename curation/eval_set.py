"""An evaluation set read and hashed by the recipe's own steps, for decontamination.

``dedup.decontaminate.eval_images`` names images a curated dataset must not contain (the
images a model trained on it is evaluated on). ``read_eval_set`` reads them with the recipe's
reader (any input it takes: a folder, WebDataset tars, Parquet; local or object store) and
hashes them with the recipe's decode step, so an evaluation image and a corpus image are
compared by the same SHA-256 of the input bytes and the same draft-decode PHash and mirror
hash (``curation.decode``); with ``embedding`` (the recipe's CLIP step, when semantic dedup runs
on its embeddings) they also get the same embedding. One Ray Data read task per partition of
the set, the model step on its own actor pool; the table that comes back (no pixels) is the
size of the evaluation set, never of the corpus. The matching is ``curation.dedup.eval_overlap``.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc

EVAL_COLUMNS = ("key", "source", "sha256", "phash", "phash_mirror", "width", "height")


def _decoded(p, reader, decode):
    from curation.steps import run_steps_locally

    for table in reader.read(p):
        yield run_steps_locally(table, [decode])


def _usable(batch: pa.Table, columns: list[str]) -> pa.Table:
    """The rows decode could hash (an evaluation image it could not read matches nothing)."""
    ok = pc.and_(pc.fill_null(batch.column("decode_ok"), False), pc.is_null(batch.column("reason")))
    return batch.filter(ok).select(columns)


def _embedded(batch: pa.Table, column: str) -> pa.Table:
    """The rows the embedding step embedded, without the pixels and the row state it read."""
    batch = batch.filter(pc.is_valid(batch.column(column)))
    return batch.drop_columns(["image", "decode_ok", "reason"])


def read_eval_set(
    reader, decode, embedding=None, *, embedding_column: str = "clip_embedding", relative_to: str = ""
) -> pa.Table:
    """``EVAL_COLUMNS`` of every image of the evaluation set ``reader`` is configured for, plus
    ``embedding_column`` written by the step ``embedding`` when given (an image it could not embed
    is left out); ``source`` relative to ``relative_to`` (so a decision names the image within the
    set, wherever the set lies)."""
    import ray.data

    from curation.partitions import partition_datasource
    from curation.steps import apply_step

    parts = reader.plan()
    if not parts:
        raise ValueError(f"dedup.decontaminate.eval_images={reader.cfg.uri!r} holds no image")
    source = partition_datasource(parts, lambda p: _decoded(p, reader, decode), schema=None)
    ds = ray.data.read_datasource(source, override_num_blocks=len(parts), num_cpus=reader.cfg.num_cpus)
    columns = [*EVAL_COLUMNS, *(["image", "decode_ok", "reason"] if embedding is not None else [])]
    ds = ds.map_batches(_usable, fn_kwargs={"columns": columns}, batch_format="pyarrow")
    if embedding is not None:
        kw = {"column": embedding_column}
        ds = apply_step(ds, embedding).map_batches(_embedded, fn_kwargs=kw, batch_format="pyarrow")
    tables = [b for b in ds.iter_batches(batch_format="pyarrow", batch_size=None) if b.num_rows]
    if not tables:
        return pa.table({c: pa.array([], pa.string()) for c in EVAL_COLUMNS})
    table = pa.concat_tables(tables, promote_options="default").sort_by("key")
    if relative_to:
        prefix = relative_to.rstrip("/") + "/"
        src = table.column("source")
        relative = pc.if_else(pc.starts_with(src, prefix), pc.utf8_slice_codeunits(src, len(prefix)), src)
        table = table.set_column(table.schema.get_field_index("source"), "source", relative)
    return table


def eval_reader(reader, uri: str):
    """The recipe's reader configured for the evaluation set at ``uri`` (format found from the files)."""
    return type(reader)(dataclasses.replace(reader.cfg, uri=uri, format="auto"), reader.max_bytes)
