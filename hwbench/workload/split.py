"""Megatron's --split: train, valid and test weights (no torch, so `hwbench run`'s
options are checked before anything heavy is imported)."""

from __future__ import annotations

from hwbench.errors import UsageError


def parse_split(text: str) -> list[float]:
    """'949,50,1' (or '949/50/1') -> three normalised weights; fewer are padded with 0."""
    try:
        weights = [float(part) for part in text.replace("/", ",").split(",")]
    except ValueError:
        weights = []
    if not 1 <= len(weights) <= 3 or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise UsageError(f"--split {text!r} is not accepted; give up to three non-negative weights such as 949,50,1")
    weights += [0.0] * (3 - len(weights))
    total = sum(weights)
    return [w / total for w in weights]
