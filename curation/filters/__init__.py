"""Filters: the per-row steps after decode that score images and give the ones to drop a reason.

``geometry`` (size and shape), ``person`` (salient-person detection), then the content
filters: ``clip_embedding`` (the embedding the next two and semantic dedup read),
``artistic`` (non-natural depictions), ``watermark`` and ``text`` (OCR). Model steps share
``model.ModelStep``. Each filter annotates; the writer's one decision point drops and counts.
"""
