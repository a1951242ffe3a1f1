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
derive from this list. A step is named by its config section, everywhere (the funnel, the
audit and MLflow say ``content.nsfw`` where the YAML does), and its class is that path in
CamelCase (``ContentNsfw``). Adding a filter: one file with its step class (settings dataclass,
``section``, ``reads``, ``fields``, ``reasons``, ``scores``) and one line here.
"""

from __future__ import annotations

import dataclasses

from curation.clusters import Clusters
from curation.config import JobConfig
from curation.decode import Decode
from curation.dedup.steps import DedupDecontaminate, DedupExact, DedupNear, DedupSemantic
from curation.filters.aesthetic import ContentAesthetic
from curation.filters.artistic import ContentArtistic
from curation.filters.backbone_embedding import BackboneEmbedding
from curation.filters.clip_embedding import ContentEmbedding
from curation.filters.geometry import Geometry
from curation.filters.nsfw import ContentNsfw
from curation.filters.person import Detector
from curation.filters.quality import Quality
from curation.filters.text import ContentText
from curation.filters.watermark import ContentWatermark
from curation.readers import Input
from curation.steps import Recipe
from curation.writer import Shards

# fmt: off
HUMANS1B = Recipe(
    [
        Input,               # input:               folders, WebDataset tars, Parquet; local or object store
        Decode,              # decode:              safe decode, EXIF, modes, bombs; SHA-256 and PHash
        Geometry,            # geometry:            short side, aspect ratio
        Quality,             # quality:             sharpness, exposure of decode's thumbnail; ranks duplicates
        DedupDecontaminate,  # dedup.decontaminate: copies of evaluation images             }
        DedupExact,          # dedup.exact:         identical bytes, across the run          } end of pass 1
        DedupNear,           # dedup.near:          PHash within t bits, mirror-aware        }
        Detector,            # detector:            at least one salient person
        ContentEmbedding,    # content.embedding:   CLIP embedding for the heads after it and semantic dedup
        ContentNsfw,         # content.nsfw:        LAION's CLIP NSFW detector
        ContentArtistic,     # content.artistic:    paintings, drawings, renders, screenshots...
        ContentWatermark,    # content.watermark:   LAION-style watermark classifier
        ContentAesthetic,    # content.aesthetic:   LAION aesthetic predictor v2: a stored score, optional min_score
        ContentText,         # content.text:        OCR: text-dominated images, captions, text watermarks
        BackboneEmbedding,   # backbone_embedding:  a Sapiens backbone's mean patch tokens (no CLIP needed)
        DedupSemantic,       # dedup.semantic:      CLIP cosine within k-means clusters      } end of pass 2
        Clusters,            # clusters:            hierarchical k-means ids of the kept samples, clusters.json
        Shards,              # shards:              the one decision point: shards, sidecars, manifest
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
