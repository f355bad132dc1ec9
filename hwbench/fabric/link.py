"""The catalog's link bandwidth of the device a collectives result ran on (hwbench/catalogs/devices/,
``link_bandwidth``), per direction: what each measured busbw is shown as a fraction of. nccl-tests'
busbw is the bandwidth each way of the busiest link, so it is held against half the
bidirectional figure the data sheets list; a device the catalog has no figure for gives None
with the reason."""

from __future__ import annotations

import dataclasses

from hwbench.result.collectives import CollectivesResult


@dataclasses.dataclass(frozen=True)
class LinkFigure:
    per_direction_gbs: float | None  # GB/s (10^9) each way; None: see ``text``
    text: str  # the figure and its source, or why there is none


def link_figure(result: CollectivesResult) -> LinkFigure:
    from hwbench.catalog import load_catalog

    if not result.device_model:
        return LinkFigure(None, "no link figure: the result names no device model")
    entry = load_catalog().match_device(result.device, result.device_model)
    if entry is None:
        return LinkFigure(None, f"no link figure: no catalog entry matches the {result.device} device "
                                f"{result.device_model!r}")
    link = entry.link_bandwidth
    if link is None or link.per_direction_bytes_per_s is None:
        why = link.unavailable if link is not None else "the entry has no link_bandwidth"
        return LinkFigure(None, f"no link figure for {entry.name}: {why}")
    per_direction = link.per_direction_bytes_per_s / 1e9
    return LinkFigure(per_direction, f"link: {entry.name} {link.link}, {per_direction:,.0f} GB/s each way (half of "
                                     f"{2 * per_direction:,.0f} GB/s both ways; {link.source}, read {link.read})")


def link_fraction(busbw_gbs: float | None, link: LinkFigure) -> float | None:
    """busbw over the link's figure each way; None when either is unknown."""
    if busbw_gbs is None or link.per_direction_gbs is None:
        return None
    return busbw_gbs / link.per_direction_gbs
