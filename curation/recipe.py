"""The Humans-1B curation recipe: every step in order, each configured by its own section.

    pass 1 (every input):  read -> decode -> the cheap row steps (geometry, image quality)
    global:                decontamination, exact / near dedup   (decides the survivors)
    pass 2 (survivors):    person -> CLIP -> the content filters (heads on CLIP, watermark, OCR)
                           -> a Sapiens backbone's embedding (off by default)
    global:                semantic dedup              (on pass 2's CLIP embeddings)
                           -> cluster ids of the kept samples (off by default)
                           -> shards + manifest

The global steps are the pass boundaries (``curation.steps``): the models never see an exact
or near duplicate, which web corpora hold 10-30% of. A duplicate family's representative is
chosen before detection, by quality (``curation.dedup.representative_sort_key``).

Each step declares the columns it reads and writes; building the recipe refuses an order in
which a step reads a column no earlier enabled step writes. A disabled step stays in the list
and reports itself as not applied. The job's config class, the funnel in stats.json, the step
descriptions in stats.json and MLflow, the columns dedup reads and the audit's score charts all
derive from this list. Adding a filter: one file with its step class (settings dataclass,
``section``, ``reads``, ``fields``, ``reasons``, ``scores``) and one line here.
"""

from __future__ import annotations

import dataclasses

from curation.clusters import Clusters
from curation.config import JobConfig
from curation.decode import DecodeStep
from curation.dedup.steps import Decontaminate, ExactDedup, NearDedup, SemanticDedup
from curation.filters.aesthetic import AestheticScore
from curation.filters.artistic import ArtisticFilter
from curation.filters.backbone_embedding import BackboneEmbedding
from curation.filters.clip_embedding import ClipEmbedding
from curation.filters.geometry import GeometryFilter
from curation.filters.nsfw import NsfwFilter
from curation.filters.person import PersonFilter
from curation.filters.quality import ImageQuality
from curation.filters.text import TextFilter
from curation.filters.watermark import WatermarkFilter
from curation.readers import ReadImages
from curation.steps import Recipe
from curation.writer import WriteShards

# fmt: off
HUMANS1B = Recipe(
    [
        ReadImages,       # input:              folders, WebDataset tars, Parquet; local or object store
        DecodeStep,       # decode:             safe decode, EXIF, modes, bombs; SHA-256 and PHash
        GeometryFilter,   # geometry:           short side, aspect ratio
        ImageQuality,     # quality:            sharpness, exposure of decode's thumbnail; ranks duplicates
        Decontaminate,    # dedup.decontaminate: copies of evaluation images             }
        ExactDedup,       # dedup.exact:        identical bytes, across the run          } end of pass 1
        NearDedup,        # dedup.near:         PHash within t bits, mirror-aware        }
        PersonFilter,     # detector:           at least one salient person
        ClipEmbedding,    # content.embedding:  CLIP embedding for the heads after it and semantic dedup
        NsfwFilter,       # content.nsfw:       LAION's CLIP NSFW detector
        ArtisticFilter,   # content.artistic:   paintings, drawings, renders, screenshots...
        WatermarkFilter,  # content.watermark:  LAION-style watermark classifier
        AestheticScore,   # content.aesthetic:  LAION aesthetic predictor v2: a stored score, optional min_score
        TextFilter,       # content.text:       OCR: text-dominated images, captions, text watermarks
        BackboneEmbedding,  # backbone_embedding: a Sapiens backbone's mean patch tokens (no CLIP needed)
        SemanticDedup,    # dedup.semantic:     CLIP cosine within k-means clusters      } end of pass 2
        Clusters,         # clusters:           hierarchical k-means ids of the kept samples, clusters.json
        WriteShards,      #                     the one decision point: shards, sidecars, manifest
    ],
    job=JobConfig,
)
# fmt: on

CurationConfig = HUMANS1B.config_class("CurationConfig", __name__)
ContentFiltersConfig = CurationConfig.sections["content"]
ContentFiltersConfig.__qualname__ = ContentFiltersConfig.__name__ = "ContentFiltersConfig"
DedupConfig = CurationConfig.sections["dedup"]
DedupConfig.__qualname__ = DedupConfig.__name__ = "DedupConfig"


def weightless_content_filters(text: bool = True, num_cpus: float = 0.5) -> ContentFiltersConfig:
    """Content filters that need no model weights from outside: only OCR (rapidocr ships its models).

    Every other content step (CLIP and the filters on its embedding, whichever the recipe holds)
    is explicitly disabled, which stats.json and MLflow record as "not applied". For laptops,
    demos and tests.
    """
    cfg = ContentFiltersConfig()
    for section in dataclasses.fields(cfg):
        getattr(cfg, section.name).enabled = False
    cfg.text.enabled = text
    cfg.text.num_cpus = num_cpus
    return cfg
