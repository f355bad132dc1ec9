"""Bytes as people write them, both ways: the one byte formatter and size parser; and the
one formatter of bandwidths and FLOP rates for people to read."""

from __future__ import annotations

import math
import re

from hwbench.errors import UsageError

GIB = 2 ** 30
_UNITS = {"": 1, "B": 1, "K": 2 ** 10, "KIB": 2 ** 10, "KB": 10 ** 3, "M": 2 ** 20, "MIB": 2 ** 20, "MB": 10 ** 6,
          "G": 2 ** 30, "GIB": 2 ** 30, "GB": 10 ** 9, "T": 2 ** 40, "TIB": 2 ** 40, "TB": 10 ** 12}
_DECIMAL_POWERS = {"KB": 3, "MB": 6, "GB": 9, "TB": 12}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")  # ASCII digits: float() reads '٨٠' too


def gib(value: float | int | None, digits: int = 2, unit: bool = False, missing: str = "-",
        thousands: bool = False) -> str:
    """``value`` bytes in GiB (2^30) with ``digits`` decimals, "GiB" appended with
    ``unit``, thousands separated by commas with ``thousands``; ``missing`` for None."""
    if value is None:
        return missing
    text = f"{value / GIB:{',' if thousands else ''}.{digits}f}"
    return f"{text} GiB" if unit else text


def human_bytes(value: float | None) -> str:
    """Bytes in the largest binary unit under 1024 (B, KiB, MiB, GiB, TiB), one decimal; "-" for None."""
    if value is None:
        return "-"
    for name in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or name == "TiB":
            return f"{value:.1f} {name}" if name != "B" else f"{int(value)} B"
        value /= 1024
    return str(value)


def parse_size(text: str, option: str = "--device-memory") -> int:
    """Bytes from '32GiB', '80GB', '24G', '1.5TiB': GiB/MiB/... and the bare
    letters G/M/K/T are powers of 2; GB/MB/KB/TB are powers of 10; no unit is bytes."""
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else None
    size = float(match.group(1)) * _UNITS[unit] if match and unit in _UNITS else math.nan
    # 400 digits are a float's inf (int() of it was an OverflowError); a unit's fraction of a byte is
    # dropped (1.3KiB), but a number of bytes is meant whole (4.5 is no size, not 4)
    if not (math.isfinite(size) and size >= 1) or (unit in ("", "B") and not size.is_integer()):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise UsageError(f"{option} {shown!r} is not a size; accepted: a positive number with GiB/MiB/G (2^30, 2^20) "
                         "or GB/MB (10^9, 10^6), or whole bytes with no unit, at least 1 byte and less than 10^308, "
                         "e.g. 32GiB, 80GB, 24G")
    return int(size)


def decimal_size_note(text: str | None, option: str) -> str | None:
    """How a size in a decimal unit was read, since a memory size is usually meant in binary ones:
    '--device-memory 80GB is read as 80 x 10^9 bytes = 74.5 GiB (GB is a power of 10, as disks
    count); for 80 x 2^30 bytes give 80GiB'. None for a binary unit, bytes, or no size (a bad one
    is parse_size's to refuse)."""
    match = _SIZE.match(text or "")
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _DECIMAL_POWERS or float(match.group(1)) <= 0:
        return None
    number, letter = match.group(1), unit[0]
    return (f"{option} {match.group(0).strip()} is read as {number} x 10^{_DECIMAL_POWERS[unit]} bytes = "
            f"{human_bytes(parse_size(match.group(0), option))} ({unit} is a power of 10, as disks count); for "
            f"{number} x 2^{_UNITS[letter].bit_length() - 1} bytes give {number}{letter}iB")


def bandwidth_text(bytes_per_s: float | None) -> str:
    """Bytes per second in GB/s (10^9, as bandwidths are quoted), one decimal; "-" for None."""
    return "-" if bytes_per_s is None else f"{bytes_per_s / 1e9:,.1f} GB/s"


def flops_rate_text(flops_per_s: float | None) -> str:
    """A FLOP rate in the largest of TFLOP/s, GFLOP/s, MFLOP/s that keeps it at least 1; "-" for None."""
    if flops_per_s is None:
        return "-"
    for scale, unit in ((1e12, "TFLOP/s"), (1e9, "GFLOP/s")):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:,.1f} {unit}"
    return f"{flops_per_s / 1e6:,.2f} MFLOP/s"
