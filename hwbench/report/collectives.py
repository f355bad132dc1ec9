"""The report's section of `hwbench collectives` results: per result, nccl-tests' figures (time,
algbw, busbw, #wrong) of each collective, form and size, and the ring's slow links when measured."""

from __future__ import annotations

from hwbench.fabric.table import scope_title
from hwbench.report.document import Section, Table
from hwbench.result.collectives import CollectivesResult, Row

HEADERS = ["collective", "form", "size (B)", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong",
           "slowest rank (us)"]


def collectives_section(results: list[tuple[CollectivesResult, str]]) -> Section | None:
    """None without collectives results."""
    if not results:
        return None
    section = Section("Collectives")
    section.blocks.append(("p", "Measured as nccl-tests measures them (docs/collectives.md): time is the mean over "
                                "ranks; busbw = algbw x the collective's factor (nccl-tests' doc/PERFORMANCE.md); "
                                "#wrong counts the values the check found wrong."))
    for result, file in results:
        hosts = f" on {result.hosts} hosts" if result.hosts > 1 else ""
        section.blocks.append(("h", f"{result.run_id}: {result.device_model or result.device}, {result.dist_backend}, "
                                    f"{result.world_size} ranks{hosts} ({file})"))
        if result.status != "ok":
            section.blocks.append(("p", f"status {result.status}: {result.error.message if result.error else ''}"))
            continue
        section.blocks.append(("table", _table(result.rows)))
        for scope in result.scopes:  # a multi-node run's figures within the nodes and between them
            unmeasured = "" if scope.rows else f": not measured, {scope.unmeasured}"
            section.blocks.append(("p", scope_title(scope) + unmeasured))
            if scope.rows:
                section.blocks.append(("table", _table(scope.rows)))
        if result.slow_link is not None:
            section.blocks.append(("p", _slow_link_text(result)))
    return section


def _table(rows: list[Row]) -> Table:
    return Table(HEADERS, [[row.collective, "in place" if row.in_place else "out of place", row.size_bytes,
                            round(row.time_us, 1), row.algbw_gbs, row.busbw_gbs,
                            "n/a" if row.wrong is None else row.wrong, round(row.time_us_max, 1)] for row in rows])


def _slow_link_text(result: CollectivesResult) -> str:
    from hwbench.fabric.table import slow_link_text

    ring = result.slow_link
    assert ring is not None
    if not ring.slow:
        return (f"Ring of send/recv pairs ({len(ring.links)}): no pair slower than the median of the others by more "
                f"than {ring.threshold:.0%}.")
    return (f"Slow links, {len(ring.slow)} of {len(ring.links)} pairs of the ring slower than the median of the "
            f"others by more than {ring.threshold:.0%}: " + "; ".join(slow_link_text(link) for link in ring.slow) + ".")
