"""Where a model step's threshold comes from, and the start-up warning when it says nowhere.

A model's score means nothing until it is measured on labelled images for the weights at hand:
the same P(non-natural) of 0.5 drops different images under two CLIP models, and a detector's
0.9 is another detector's 0.4. So every threshold a model step drops rows by is traced, at
start-up, to one of

- the section's ``calibration`` setting: one line saying what the threshold was measured on
  (weights, labelled images, counts, precision and recall, date), which ``pipelines/calibrate.py``
  writes beside the threshold it picks for the CLIP heads;
- a ``Published`` value: one used with the same model by the people who trained it (e.g. the
  NSFW and watermark cut-offs LAION applied with its own models), or measured in this project
  (``docs/results``, ``shared/assets/PROVENANCE.md``);

and otherwise the step warns (``UncalibratedThresholdWarning``), naming the setting and how to
calibrate it. Where the threshold came from is part of the step's description (stats.json).
"""

from __future__ import annotations

import dataclasses
import warnings

NOT_MEASURED = "not measured"


class UncalibratedThresholdWarning(UserWarning):
    """A model step drops rows by a threshold that says nowhere what it was measured on."""


@dataclasses.dataclass(frozen=True)
class Published:
    """Threshold values with a source for one model: who used or measured them, and where."""

    values: tuple[float, ...]
    source: str


def threshold_source(value: float | None, calibration: str, published: Published | None) -> str | None:
    """Where ``value`` comes from: the ``calibration`` record, else ``published``'s source when it
    lists ``value``; None when neither says. No threshold (None) drops nothing: nothing to trace."""
    if value is None:
        return "no threshold: the score is recorded, nothing is dropped by it"
    if calibration:
        return f"calibration: {calibration}"
    if published is not None and value in published.values:
        return published.source
    return None


def calibrate_hint(step: str, section: str) -> str:
    """How to calibrate a CLIP head's threshold (the text of the start-up warning)."""
    return (
        f"pick one for your weights with `python pipelines/calibrate.py {step} <folder with positives/ "
        f"and negatives/> --config <this job's YAML>` and add the {section} fragment it writes "
        f"(the threshold and its {section}.calibration), or disable the step with {section}.enabled=false"
    )


def warn_unmeasured(setting: str, value: float, calibration: str, how: str) -> None:
    """The start-up warning for a threshold with no source (see the module doc)."""
    warnings.warn(
        f"{setting}={value} says nowhere what it was measured on ({calibration} is empty, and no "
        f"published source uses this value with this model): {how}",
        UncalibratedThresholdWarning,
        stacklevel=3,
    )
