"""Time to a target quality: what `--target-ppl` / `--target-loss` ask for, resolved and
checked before a run starts (one line, exit 2), and the test a validation meets.

A run with a target validates every --eval-interval steps and stops at the first
validation whose perplexity (or loss) is at or below the target, as an MLPerf Training
run stops its clock "as soon as any part of the system determines target accuracy has
been reached" (MLPerf Training rules, "Run Results"). On data whose lowest reachable
perplexity is known (the built-in language, --data synthetic) a target may be given
relative to it, ``floor*1.2``, and a target below it, which no model can reach, is refused.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

from hwbench.errors import UsageError

FLOOR_PREFIX = "floor*"
# MLPerf Training (Closed division) keeps up to 30 minutes of model initialisation off the
# clock; what lies beyond it counts ("Run Results").
INIT_BOUND_S = 1800.0


def _factor(text: str) -> float | None:
    """F of ``floor*F``, or None when ``text`` is not of that form."""
    if not text.lower().startswith(FLOOR_PREFIX):
        return None
    try:
        return float(text[len(FLOOR_PREFIX):])
    except ValueError:
        return math.nan


def valid_target_ppl(text: str) -> bool:
    """A perplexity above 1, or floor*F with F above 1 (the floor itself is never reached)."""
    factor = _factor(text)
    if factor is not None:
        return math.isfinite(factor) and factor > 1
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and value > 1


def number_as_text(value: Any) -> Any:
    """A number given for --target-ppl (a suite's `target_ppl: 5.5`, the Python API) as the
    text the command line would give."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return repr(float(value))
        except OverflowError:  # an integer beyond a float: refused as it was given
            return value
    return value


@dataclasses.dataclass(frozen=True)
class Target:
    metric: str  # "ppl" or "loss" (validation loss, nats)
    value: float  # the resolved target: a perplexity or a loss
    given: str  # as the user gave it: "floor*1.2", "5.5"

    def met(self, figure: float | None) -> bool:
        """Whether a validation figure of this target's metric (a point's ``ppl`` or ``loss``) is at
        or below the target; None (not measured) is not."""
        return figure is not None and figure <= self.value

    def text(self) -> str:
        shown = f"{'PPL' if self.metric == 'ppl' else 'validation loss'} {self.value:.4g}"
        return shown + ("" if _factor(self.given) is None else f" ({self.given})")


def _largest_factor(floor_ppl: float) -> str:
    """The largest F of four significant digits whose product with the floor is still a float,
    rounded down: the F a refusal offers is accepted."""
    limit = sys.float_info.max / floor_ppl
    unit = 10.0 ** (math.floor(math.log10(limit)) - 3)
    return f"{math.floor(limit / unit) * unit:.4g}"


def resolve_target(target_ppl: str | None, target_loss: float | None, data: str, floor_nats: float | None,
                   what_floor: str) -> Target | None:
    """The run's target, checked against the data's floor (``floor_nats``: its entropy rate,
    None when unknown; ``what_floor`` names it in messages). UsageError: both targets given,
    floor*F on data without a known floor, a target below the floor."""
    if target_ppl is not None and target_loss is not None:
        raise UsageError(f"--target-ppl {target_ppl} and --target-loss {target_loss:g}: give one target")
    if target_ppl is None and target_loss is None:
        return None
    floor_ppl = math.exp(floor_nats) if floor_nats is not None else None
    if target_ppl is not None:
        factor = _factor(target_ppl)
        if factor is not None:
            if floor_ppl is None:
                raise UsageError(f"--target-ppl {target_ppl}: --data {data} has no known floor; give a perplexity "
                                 "(a number), or --data builtin or synthetic, whose floor is known")
            if not math.isfinite(factor * floor_ppl):  # 1e308 x a floor of 1931: infinity, which no result holds
                raise UsageError(f"--target-ppl {target_ppl} is beyond a float: F times the lowest reachable "
                                 f"perplexity {floor_ppl:.4f} of {what_floor}; give floor*F with F at most "
                                 f"{_largest_factor(floor_ppl)}")
            return Target("ppl", factor * floor_ppl, target_ppl)
        value = float(target_ppl)
        if floor_ppl is not None and value <= floor_ppl:
            raise UsageError(
                f"--target-ppl {target_ppl} is at or below the lowest reachable perplexity {floor_ppl:.4f} "
                f"of {what_floor}; give a number above it, or floor*F with F > 1"
            )
        return Target("ppl", value, target_ppl)
    assert target_loss is not None
    if floor_nats is not None and target_loss <= floor_nats:
        raise UsageError(
            f"--target-loss {target_loss:g} is at or below the lowest reachable loss {floor_nats:.4f} nats "
            f"of {what_floor}; give a number above it"
        )
    return Target("loss", float(target_loss), number_as_text(target_loss))
