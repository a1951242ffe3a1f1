"""One explorer session: the version explored and what its pages read, opened once at start-up."""

from __future__ import annotations

import dataclasses
import time

from curation.audit.explore_diff import FateChanges
from curation.audit.explore_filters import QueryError
from curation.audit.explore_query import ExploreConfig, ManifestQuery
from curation.audit.explore_thumbs import ThumbnailCache
from curation.audit.loading import AuditedVersion
from pipelines.explorer.annotations import AnnotationLookup


@dataclasses.dataclass(frozen=True)
class Side:
    """A version's queries and thumbnails."""

    query: ManifestQuery
    thumbs: ThumbnailCache

    @classmethod
    def open(cls, v: AuditedVersion, cfg: ExploreConfig) -> Side:
        query = ManifestQuery(v, cfg)
        return cls(query, ThumbnailCache(v, query.folder / "thumbs"))

    @property
    def version(self) -> AuditedVersion:
        return self.query.v


@dataclasses.dataclass(frozen=True)
class ExploreSession:
    """The explored version (B), the earlier one it is compared with (A, ``--against``), the
    fate changes between them, and an annotation version of B."""

    cfg: ExploreConfig
    explored: Side
    against: Side | None = None
    changes: FateChanges | None = None
    annotations: AnnotationLookup | None = None
    opened_s: float = 0.0

    @classmethod
    def open(
        cls,
        v: AuditedVersion,
        cfg: ExploreConfig,
        against: AuditedVersion | None = None,
        annotations: str | None = None,
    ) -> ExploreSession:
        t0 = time.perf_counter()
        explored = Side.open(v, cfg)
        other = Side.open(against, cfg) if against is not None else None
        changes = FateChanges(explored.query.db, against, v, explored.query.folder) if against is not None else None
        lookup = AnnotationLookup(annotations, v.id) if annotations else None
        return cls(cfg, explored, other, changes, lookup, time.perf_counter() - t0)

    @property
    def version(self) -> AuditedVersion:
        return self.explored.version

    def side(self, name: str) -> Side:
        """``explored`` or ``against`` (when there is one)."""
        if name == "against" and self.against is not None:
            return self.against
        if name in ("", "explored"):
            return self.explored
        raise QueryError(f"of: {name!r} is not a version of this session (explored{', against' * bool(self.against)})")
