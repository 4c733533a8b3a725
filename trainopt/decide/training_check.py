"""Whether the recommended settings still train the same: the training check's rule.

Speed knobs can change what training computes: bf16 and fp16 round activations and
gradients, ``torch.compile`` has shipped wrong gradients, TF32 and fused optimizers change
low-order bits. The check trains three runs from the same initial weights for the same
number of optimizer steps and reads the loss at every step:

- the *reference*: the baseline at the recommended batch size and accumulation, so that it
  differs from the recommended settings only in knobs that are not meant to change the
  mathematics (a batch-size change changes the optimisation by design; it is reported with
  the learning-rate hint, never judged);
- its *twin*: the reference again in another data order (and other dropout masks): how far
  the same training lands anyway;
- the *recommended* settings, in the reference's data order.

The rule, over the last quarter of the steps (at least ``MIN_TAIL_STEPS``), the *tail*:

- ``diverged``: the recommended run's loss became non-finite, or its tail mean exceeds
  ``BLOWUP_FACTOR`` times the loss it started from while the reference's did not.
- ``worse``: its tail mean exceeds the reference's by more than the tolerance,
  ``TOLERANCE_FACTOR`` times the *yardstick*, and by more than ``RELATIVE_FLOOR`` of the
  reference's tail mean. The yardstick is the larger of the twin's distance from the
  reference (tail mean against tail mean) and what step-to-step minibatch noise alone moves
  the difference of two tail means (the loss's step-to-step noise, from successive
  differences so a falling trend does not count, times ``sqrt(2 / tail)``). One twin is one
  draw of the natural spread and may land close by chance; the noise term keeps the
  yardstick from collapsing then, and the factor 3 puts a run that differs from the
  reference only as another data order does outside it rarely (0.3 % two-sided for normal
  noise at the yardstick's scale). Measured false alarms: ``benchmarks/training_check.py``.
- ``same`` otherwise: a lower loss than the reference is not a failure.
- ``inconclusive``: the reference or its twin failed, or the reference itself diverged:
  there is nothing to judge against.

Pure: plain data in, plain data out.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from trainopt.knobs import catalog as knobs

__all__ = [
    "VERDICTS",
    "TAIL_SHARE",
    "MIN_TAIL_STEPS",
    "PHRASES",
    "TOLERANCE_FACTOR",
    "RELATIVE_FLOOR",
    "BLOWUP_FACTOR",
    "BATCH_KNOBS",
    "TrainingVerdict",
    "judge",
    "reference_settings",
    "suspects",
    "tail_steps",
    "without",
]

VERDICTS = ("same", "worse", "diverged", "inconclusive")
# The part of the run judged: the last quarter, where early transients have passed.
TAIL_SHARE = 0.25
MIN_TAIL_STEPS = 5
TOLERANCE_FACTOR = 3.0
RELATIVE_FLOOR = 0.02
BLOWUP_FACTOR = 2.0
# Knobs that set the optimisation itself; the reference takes them from the recommended settings.
BATCH_KNOBS = ("batch_size", "grad_accum")


@dataclass(frozen=True)
class TrainingVerdict:
    """The recommended run against the reference and its twin.

    Attributes:
        verdict: One of ``VERDICTS``.
        reason: One sentence with the loss figures.
        tail_steps: Steps in the judged tail.
        reference_tail: Mean loss of the reference over the tail (None: not finite).
        twin_tail: Mean loss of the twin over the tail.
        candidate_tail: Mean loss of the recommended run over the tail.
        twin_gap: ``|twin_tail - reference_tail|``.
        noise_floor: The step-noise part of the yardstick.
        yardstick: ``max(twin_gap, noise_floor)``.
        tolerance: How far above the reference the candidate's tail may lie.
    """

    verdict: str
    reason: str
    tail_steps: int
    reference_tail: float | None = None
    twin_tail: float | None = None
    candidate_tail: float | None = None
    twin_gap: float | None = None
    noise_floor: float | None = None
    yardstick: float | None = None
    tolerance: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tail_steps(steps: int) -> int:
    """Steps in the judged tail of a run of ``steps``."""
    return min(steps, max(MIN_TAIL_STEPS, math.ceil(steps * TAIL_SHARE)))


def _finite(losses: Sequence[float | None]) -> bool:
    return all(v is not None and math.isfinite(v) for v in losses)


def _step_noise(runs: Sequence[Sequence[float]]) -> float:
    """The loss's step-to-step sd, from successive differences (a smooth trend cancels)."""
    diffs = [b - a for run in runs for a, b in zip(run, run[1:])]
    if len(diffs) < 2:
        return 0.0
    return statistics.pstdev(diffs) / math.sqrt(2.0)


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def judge(reference: Sequence[float | None], twin: Sequence[float | None], candidate: Sequence[float | None],
          steps: int) -> TrainingVerdict:
    """The verdict of one recommended run against the reference and its twin (module docstring).

    Args:
        reference: The reference's loss at every step (None: non-finite).
        twin: The twin's.
        candidate: The recommended run's.
        steps: Steps every run was asked for (a run that stopped early has fewer losses).
    """
    m = tail_steps(steps)
    if len(reference) < steps or not _finite(reference):
        return TrainingVerdict("inconclusive", f"the reference run itself did not train: its loss became non-finite "
                               f"at step {len(reference)} of {steps}; nothing to judge the recommended settings against", m)
    if len(twin) < steps or not _finite(twin):
        return TrainingVerdict("inconclusive", f"the reference in another data order did not train: its loss became "
                               f"non-finite at step {len(twin)} of {steps}; the natural spread is unknown", m)
    ref_tail = statistics.fmean(reference[-m:])
    twin_tail = statistics.fmean(twin[-m:])
    gap = abs(twin_tail - ref_tail)
    floor = _step_noise([reference[-m:], twin[-m:]]) * math.sqrt(2.0 / m)
    yardstick = max(gap, floor)
    tolerance = max(TOLERANCE_FACTOR * yardstick, RELATIVE_FLOOR * abs(ref_tail))
    figures = dict(tail_steps=m, reference_tail=ref_tail, twin_tail=twin_tail, twin_gap=gap, noise_floor=floor,
                   yardstick=yardstick, tolerance=tolerance)
    if len(candidate) < steps or not _finite(candidate):
        return TrainingVerdict("diverged", f"the loss became non-finite at step {len(candidate)} of {steps} "
                               f"(the reference's mean over the last {m} steps: {ref_tail:.4g})", **figures)
    cand_tail = statistics.fmean(candidate[-m:])
    figures["candidate_tail"] = cand_tail
    where = (f"mean loss over the last {m} of {steps} steps {cand_tail:.4g} against the reference's {ref_tail:.4g} "
             f"(another data order: {twin_tail:.4g})")
    if cand_tail > BLOWUP_FACTOR * candidate[0] and ref_tail <= BLOWUP_FACTOR * reference[0]:
        return TrainingVerdict("diverged", f"the loss blew up from {candidate[0]:.4g} at the first step to a {where}",
                               **figures)
    if cand_tail - ref_tail > tolerance:
        return TrainingVerdict("worse", f"{where}: {cand_tail - ref_tail:.4g} higher, beyond the {tolerance:.4g} "
                               f"the same training moves anyway", **figures)
    return TrainingVerdict("same", f"{where}, within the {tolerance:.4g} the same training moves anyway", **figures)


# How a verdict reads after "with it the settings ...".
PHRASES = {"worse": "train worse", "diverged": "diverge", "same": "train the same", "inconclusive": "cannot be judged"}


def reference_settings(baseline: Mapping[str, Any], recommended: Mapping[str, Any]) -> dict[str, Any]:
    """The reference: the baseline at the recommended batch size and accumulation."""
    out = dict(baseline)
    for k in BATCH_KNOBS:
        if k in recommended:
            out[k] = recommended[k]
    return out


def suspects(reference: Mapping[str, Any], recommended: Mapping[str, Any]) -> list[str]:
    """The knobs that may explain a run that trains differently, in catalog order.

    Those where the two settings differ and that can change the numbers training computes
    (``Knob.numerics``); when only other knobs differ, all of them (a failure must be
    explained by something that changed).
    """
    differ = [k for k in knobs.KNOBS if k not in BATCH_KNOBS and reference.get(k) != recommended.get(k)]
    numeric = [k for k in differ if knobs.KNOBS[k].numerics]
    return numeric or differ


def without(recommended: Mapping[str, Any], reference: Mapping[str, Any], dropped: Sequence[str]) -> dict[str, Any]:
    """The recommended settings with the ``dropped`` knobs back at the reference's values."""
    out = dict(recommended)
    for k in dropped:
        out[k] = reference.get(k, knobs.KNOBS[k].default)
    return out
