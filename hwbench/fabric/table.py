"""A collectives result as nccl-tests prints it: one line per size, the out-of-place figures then
the in-place ones, time in microseconds, algbw and busbw in GB/s (10^9), #wrong from the check;
then the ring of pairwise send/recv and every slow link, when measured. Text only: the command prints it."""

from __future__ import annotations

from hwbench.fabric.collectives import COLLECTIVES, NO_FORM
from hwbench.fabric.link import LinkFigure, link_figure, link_fraction
from hwbench.result.collectives import CollectivesResult, Link, Row, ScopeRows


def _figures(row: Row | None, link: LinkFigure) -> str:
    if row is None:
        return f"{'-':>10} {'-':>8} {'-':>8} {'-':>6} {'-':>7} {'-':>10} {'-':>10}"
    wrong = "n/a" if row.wrong is None else str(row.wrong)
    algbw = "-" if row.algbw_gbs is None else f"{row.algbw_gbs:.3f}"
    busbw = "-" if row.busbw_gbs is None else f"{row.busbw_gbs:.3f}"
    fraction = link_fraction(row.busbw_gbs, link)
    of_link = "-" if fraction is None else f"{fraction:.1%}"
    return (f"{row.time_us:>10.1f} {algbw:>8} {busbw:>8} {of_link:>6} {wrong:>7} {row.time_us_min:>10.1f} "
            f"{row.time_us_max:>10.1f}")


def collectives_table(result: CollectivesResult) -> str:
    link = link_figure(result)
    hosts = f" on {result.hosts} hosts" if result.hosts > 1 else ""
    lines = [f"# {result.device} ({result.device_model or 'unknown model'}), {result.dist_backend}, "
             f"{result.world_size} ranks{hosts}; time: mean over ranks (us), min and max rank; bandwidths in GB/s; "
             "link: busbw as a fraction of the catalog's link bandwidth each way",
             f"# {link.text}"]
    lines += _rows_lines(result.rows, link)
    for scope in result.scopes:
        lines += ["", f"# {scope_title(scope)}"]
        lines += _rows_lines(scope.rows, link) if scope.rows else [f"not measured: {scope.unmeasured}"]
    if result.check_passed is not None:
        lines += ["", "check: " + ("every value as expected" if result.check_passed else "WRONG VALUES (see #wrong)")]
    if result.slow_link:
        lines += ["", *ring_lines(result)]
    return "\n".join(lines) + "\n"


def scope_title(scope: ScopeRows) -> str:
    """What a multi-node run's subgroup table measured."""
    if scope.scope == "intra_node":
        return (f"intra-node: within each node ({', '.join(map(str, scope.groups)) or 'none'}), every node's group "
                "at once")
    return f"inter-node: between one rank per node ({', '.join(map(str, scope.groups)) or 'none'})"


def _rows_lines(rows: list[Row], link: LinkFigure) -> list[str]:
    lines = []
    header = f"{'time':>10} {'algbw':>8} {'busbw':>8} {'link':>6} {'#wrong':>7} {'min':>10} {'max':>10}"
    for name in dict.fromkeys(row.collective for row in rows):
        lines += ["", f"## {name} (busbw = algbw x {COLLECTIVES[name].bus_factor_text})",
                  f"{'':23}| {'out-of-place':^65} | {'in-place':^65}",
                  f"{'size (B)':>12} {'count':>10} | {header} | {header}"]
        sizes: dict[int, dict[bool, Row]] = {}
        for row in rows:
            if row.collective == name:
                sizes.setdefault(row.size_bytes, {})[row.in_place] = row
        for size, placed in sizes.items():
            any_row = next(iter(placed.values()))
            out_of_place, in_place = _figures(placed.get(False), link), _figures(placed.get(True), link)
            lines.append(f"{size:>12} {any_row.elements:>10} | {out_of_place} | {in_place}")
        if name in NO_FORM:
            lines.append(f"  ('-': {NO_FORM[name]})")
    return lines


def ring_lines(result: CollectivesResult) -> list[str]:
    ring = result.slow_link
    assert ring is not None
    lines = [f"## ring of send/recv pairs, {ring.size_bytes} B each way (time one way, us; slowdown against the "
             "median of the other pairs)"]
    for link in ring.links:
        busbw = "-" if link.busbw_gbs is None else f"{link.busbw_gbs:.3f} GB/s"
        slowdown = "-" if link.slowdown is None else f"{link.slowdown:+.0%}"
        lines.append(f"  rank {link.sender} ({link.sender_host}) -> rank {link.receiver} ({link.receiver_host}), "
                     f"{'inter' if link.inter_node else 'intra'}-node: {link.time_us:.1f} us, {busbw}, {slowdown}"
                     + (" SLOW" if link in ring.slow else ""))
    lines += [f"slow link: {slow_link_text(link)}" for link in ring.slow]
    if not ring.slow:
        known = [link.slowdown for link in ring.links if link.slowdown is not None]
        slowest = f" (the slowest {max(known):.0%})" if known else ""
        lines.append(f"no slow link: no pair is slower than the median of the others by more than "
                     f"{ring.threshold:.0%}{slowest}")
    else:
        lines.append(f"{len(ring.slow)} of {len(ring.links)} pairs slower than the median of the others by more than "
                     f"{ring.threshold:.0%}")
    return lines


def slow_link_text(link: Link) -> str:
    """One slow pair: its ranks and hosts, time, bandwidth and slowdown."""
    busbw = "-" if link.busbw_gbs is None else f"{link.busbw_gbs:,.3f} GB/s"
    return (f"rank {link.sender} ({link.sender_host}) -> rank {link.receiver} ({link.receiver_host}), "
            f"{'inter' if link.inter_node else 'intra'}-node: {link.time_us:,.1f} us one way ({busbw}), "
            f"{link.slowdown or 0:.0%} slower than the median of the other pairs")
