"""Sampling policies of the pretraining stream (``data.sampling``): how likely each sample is drawn.

A policy gives every sample of a dataset version an acceptance probability ``a`` in [0, 1],
computed from the sample's row in its shard's Parquet sidecar (``CuratedOutput.read_sidecar``:
only the columns the policy names, read when a slot opens the shard) and, for ``balanced``,
from the version's ``clusters.json``. Nothing version-wide is held per sample: a shard's
probabilities live while its slot reads it. The stream (``training.data.ShardStream``) keeps
a sample it reads when ``u < a``, ``u`` a stateless draw from (seed, epoch, key): the same
whichever slot reads the sample, new every epoch, and re-derived exactly by a resumed slot
(the slot's position is all the sampler needs). Across epochs sample ``i`` is then kept with
frequency ``a_i``, i.e. it makes up ``a_i / sum(a)`` of all draws: the policy's distribution.

- ``uniform``: no sampler at all (every sample once per epoch, no sidecar read).
- ``filter``: ``a = 1`` within every bound of ``data.sampling.filter`` (``Bounds``), else 0.
- ``weighted``: ``a = min(1, w / cap)``, ``w = WeightConfig``'s function of one column, clipped
  to ``[lo, hi]``; ``cap = hi`` unless ``data.sampling.cap`` is set; zero outside the
  filter's bounds, when it has any.
- ``balanced`` (Vo et al. 2024, "Automatic data curation for self-supervised learning"):
  uniform over the non-empty top-level clusters, then uniform over the non-empty children of
  the chosen cluster at each level, then uniform within the leaf. A sample's probability is
  ``p = 1/K_0 * prod_{l>=1} 1/children(its level-(l-1) cluster) * 1/size(its leaf)``; its
  weight ``w = N p`` (``N`` kept samples: 1 is the uniform share); ``a = min(1, w / cap)``,
  ``cap`` = the largest weight unless set.

Trade-off (rejection while streaming, against resampling from per-cluster shard lists).
Rejection reads every sample once per epoch and keeps the fraction ``mean(a)`` of them (the
slots count ``offered`` and ``accepted``; pretraining logs their ratio as ``data_acceptance``):
the draws are exact, and ``1 - mean(a)`` of the reads are wasted. For ``balanced`` that fraction
is ``1 / (N max p)`` (``Sampler.expected_acceptance``): the more unequal the clusters, the lower
(one leaf of a single sample under a parent with few children sets ``max p``). A
``data.sampling.cap`` below the largest weight buys acceptance by flattening the weights above
it: those samples are drawn every epoch, as Vo et al. take small clusters whole. Within an
epoch no sample is drawn twice, so a policy can lower a sample's share but never raise it
above one draw per epoch; the shares are exact across epochs. Resampling from per-cluster
lists of (shard, offset) would read only what it keeps and draw with replacement, but needs an
index of every sample by cluster written by curation and random access into the shards; it is
not built.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.output import CuratedOutput
from training.config import Bounds, SamplingConfig, WeightConfig

KEY = "data.sampling"
_MASK64 = (1 << 64) - 1
_ACCEPT = 0xACCE97  # salts the acceptance draws (apart from the stream's shard order and buffer)
CLUSTER_COLUMN = "cluster_l{level}"  # a sidecar's cluster id at one level (curation's hierarchical k-means)


def cluster_column(level: int) -> str:
    return CLUSTER_COLUMN.format(level=level)


# ---- seeded draws ----------------------------------------------------------------------------------


def mix64(*values: int) -> int:
    """A stateless 64-bit hash of integers (splitmix64 steps): seeded draws without RNG state."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        h = z ^ (z >> 31)
    return h


def key_hash(key: str) -> int:
    """A sample key as a 64-bit integer (for ``mix64``), the same in every process."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def accepted(seed: int, epoch: int, key: str, chance: float) -> bool:
    """Whether a sample read in ``epoch`` is kept, with probability ``chance``: a draw from
    (seed, epoch, key) alone, so any slot, and a resumed one, decides alike."""
    if chance >= 1.0:
        return True
    if chance <= 0.0:
        return False
    return mix64(seed, _ACCEPT, epoch, key_hash(key)) < chance * 2.0**64


# ---- the functions of the attributes ------------------------------------------------------------


def numeric(table: pa.Table, column: str, setting: str) -> np.ndarray:
    """A sidecar column as float64, null -> NaN; a column that is not numeric is a ``ValueError``."""
    try:
        values = pc.cast(table.column(column), pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ValueError(f"{setting}: column {column!r} is {table.schema.field(column).type}, not a number") from None
    return pc.fill_null(values, math.nan).to_numpy(zero_copy_only=False)


def weights(cfg: WeightConfig, values: np.ndarray) -> np.ndarray:
    """``WeightConfig``'s weight of each value (NaN, i.e. no value, weighs ``lo``)."""
    z = cfg.scale * values + cfg.offset
    with np.errstate(over="ignore", invalid="ignore"):
        if cfg.fn == "linear":
            w = z
        elif cfg.fn == "power":
            w = np.maximum(z, 0.0) ** cfg.exponent
        else:
            w = np.exp(z)
    lo, hi = cfg.clip
    return np.where(np.isnan(w), lo, np.clip(w, lo, hi))


def within(bounds: dict[str, Bounds], table: pa.Table) -> np.ndarray:
    """Whether each row lies within every column's bounds (a null value lies within none)."""
    keep = np.ones(table.num_rows, dtype=bool)
    for column, b in bounds.items():
        v = numeric(table, column, f"{KEY}.filter.{column}")
        ok = ~np.isnan(v)
        if b.min is not None:
            ok &= v >= b.min
        if b.max is not None:
            ok &= v <= b.max
        keep &= ok
    return keep


def leaf_weights(clusters: dict) -> np.ndarray:
    """Per leaf cluster id: the weight ``N p`` of each of its samples under hierarchical balancing
    (the module docstring); 0 for an empty leaf."""
    levels, parents = clusters["levels"], clusters["parents"]
    counts = [_dense(level["counts"], level["k"], f"level {i} counts") for i, level in enumerate(levels)]
    chance = (counts[0] > 0) / max(1, int((counts[0] > 0).sum()))
    for i in range(1, len(levels)):
        parent = _dense(parents[i], levels[i]["k"], f"level {i} parents", fill=-1).astype(np.int64)
        alive = counts[i] > 0
        if (parent[alive] < 0).any() or (parent[alive] >= len(chance)).any():
            raise ValueError(f"clusters.json: a non-empty level-{i} cluster has no parent at level {i - 1}")
        children = np.bincount(parent[alive], minlength=len(chance))
        chance = np.where(alive, chance[np.maximum(parent, 0)] / np.maximum(children[np.maximum(parent, 0)], 1), 0.0)
    leaves = counts[-1]
    return np.where(leaves > 0, chance * leaves.sum() / np.maximum(leaves, 1), 0.0)


def _dense(mapping: dict, k: int, what: str, fill: float = 0) -> np.ndarray:
    """A ``{"<id>": value}`` mapping of clusters.json as an array over ids ``0..k-1``."""
    out = np.full(k, fill, dtype=np.float64)
    for key, value in mapping.items():
        i = int(key)
        if not 0 <= i < k:
            raise ValueError(f"clusters.json: {what} name cluster {i}, outside 0..{k - 1}")
        out[i] = value
    return out


# ---- a policy on one dataset version ------------------------------------------------------------


class Sampler:
    """``data.sampling`` (not ``uniform``) on the dataset version at ``dataset_uri``: each shard's
    acceptance probabilities by key (``chances``). Picklable (a DataLoader worker may be spawned):
    it holds the settings and the URI, and reads what it needs when first asked."""

    def __init__(self, cfg: SamplingConfig, dataset_uri: str) -> None:
        if cfg.policy == "uniform":
            raise ValueError(f"{KEY}.policy=uniform needs no sampler")
        self.cfg, self.uri = cfg, dataset_uri
        self._leaf_weights: np.ndarray | None = None

    @property
    def output(self) -> CuratedOutput:
        return CuratedOutput.at(self.uri)

    def levels(self) -> int:
        return len(self._clusters()["levels"])

    def _clusters(self) -> dict:
        try:
            return self.output.clusters()
        except ValueError as err:
            raise ValueError(f"{KEY}.policy=balanced: {err}") from None

    def balance(self) -> np.ndarray:
        """Per leaf cluster id, its samples' weight (balanced only; read once)."""
        if self._leaf_weights is None:
            self._leaf_weights = leaf_weights(self._clusters())
        return self._leaf_weights

    def columns(self) -> list[str]:
        """The sidecar columns the policy reads (``key`` first)."""
        return ["key", *self.settings()]

    def cap(self) -> float:
        """The weight accepted with probability 1 (``data.sampling.cap``, else the largest weight)."""
        if self.cfg.cap > 0:
            return self.cfg.cap
        return self.cfg.weight.clip[1] if self.cfg.policy == "weighted" else float(self.balance().max())

    def expected_acceptance(self) -> float | None:
        """The share of read samples a balanced policy keeps, from clusters.json alone (None for
        the other policies: their weights are known only shard by shard)."""
        if self.cfg.policy != "balanced":
            return None
        w, sizes = self.balance(), _dense(self._clusters()["levels"][-1]["counts"], len(self.balance()), "leaf counts")
        return float((sizes * np.minimum(1.0, w / self.cap())).sum() / max(1.0, sizes.sum()))

    def settings(self) -> dict[str, str]:
        """The setting that names each column the policy reads (for errors)."""
        named = {c: f"{KEY}.filter.{c}" for c in self.cfg.filter}
        if self.cfg.policy == "weighted":
            named.setdefault(self.cfg.weight.column, f"{KEY}.weight.column={self.cfg.weight.column}")
        if self.cfg.policy == "balanced":
            named[cluster_column(self.levels() - 1)] = f"{KEY}.policy=balanced"
        return named

    def chances(self, shard: str) -> dict[str, float]:
        """``{key: acceptance probability}`` of every sample of ``shard``."""
        table = self.output.read_sidecar(shard, self.columns())
        a = within(self.cfg.filter, table).astype(np.float64)
        if self.cfg.policy == "weighted":
            w = weights(self.cfg.weight, numeric(table, self.cfg.weight.column, f"{KEY}.weight.column"))
            a *= np.minimum(1.0, w / self.cap())
        elif self.cfg.policy == "balanced":
            a *= np.minimum(1.0, self._balanced(table, shard) / self.cap())
        return dict(zip(table.column("key").to_pylist(), a.tolist()))

    def _balanced(self, table: pa.Table, shard: str) -> np.ndarray:
        column = cluster_column(self.levels() - 1)
        leaf = table.column(column).to_numpy(zero_copy_only=False)
        w = self.balance()
        if table.column(column).null_count or (leaf < 0).any() or (leaf >= len(w)).any():
            raise ValueError(
                f"{KEY}.policy=balanced: shard {shard} has {column} ids outside clusters.json's 0..{len(w) - 1}"
            )
        if (w[leaf] == 0).any():
            raise ValueError(
                f"{KEY}.policy=balanced: shard {shard} has samples in a cluster clusters.json counts empty"
            )
        return w[leaf]

    def check(self, shard: str) -> str:
        """Read what the policy needs (clusters.json, each column of ``shard``'s sidecar) before any
        work: a ``ValueError`` naming the setting when something is missing; else a one-line
        description."""
        for column, setting in self.settings().items():
            try:
                self.output.read_sidecar(shard, ["key", column])
            except ValueError as err:
                raise ValueError(f"{setting}: {err}") from None
        self.chances(shard)
        text = f"{KEY}.policy={self.cfg.policy}, reading {', '.join(self.columns()[1:])}"
        expected = self.expected_acceptance()
        return text if expected is None else f"{text}; expected acceptance {expected:.3f} of the samples read"


def sampler_of(cfg: SamplingConfig, dataset_uri: str | None) -> Sampler | None:
    """The stream's sampler: None for ``uniform`` (today's stream, no sidecar read)."""
    if cfg.policy == "uniform":
        return None
    if not dataset_uri:
        raise ValueError(f"{KEY}.policy={cfg.policy} needs the dataset version's folder (its sidecars)")
    return Sampler(cfg, dataset_uri)


def check_sampling(cfg: SamplingConfig, dataset_uri: str, shard: str) -> str | None:
    """Before a run starts: the policy's columns and clusters checked on ``shard`` (a ``ValueError``
    naming the setting), and its one-line description; None for ``uniform``."""
    sampler = sampler_of(cfg, dataset_uri)
    return sampler.check(shard) if sampler is not None else None
