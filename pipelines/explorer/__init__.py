"""The dataset explorer's web app: an interactive audit of one version, served on 127.0.0.1.

``pipelines/explore.py`` is the entry point. Here: ``session`` (``ExploreSession``: the version's
queries, thumbnails, the ``--against`` comparison and annotations, opened once), ``app``
(``create_app``: FastAPI routes rendering server-side HTML, every page a plain link; bad
parameters are a 400 or 404 with the reason), ``annotations`` (an annotation version's rows by
key) and ``templates/`` (Jinja2, autoescaped).

The queries themselves are library code below this floor: ``curation.audit.explore_query``
(DuckDB over the manifest's Parquet parts), ``explore_filters`` (what a request may name, from
the version's own stats.json and recipe), ``explore_index``, ``explore_thumbs``, ``explore_diff``.
"""
