"""`hwbench devices`: the hardware catalog with every peak's source, and which entry this
machine's device resolves to and why."""

from __future__ import annotations

import argparse

DESCRIPTION = ("List the hardware catalog (dense peaks per precision with their sources) and the device this "
               "machine would use, with the catalog entry it matches and why.")


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def _peak_cell(figure) -> str:
    if figure.dense is None:
        return "null"
    return f"{figure.dense / 1e12:g}" + (" *" if figure.sparsity else "")


def main(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from hwbench.catalog import PEAK_PRECISIONS, load_catalog
    from hwbench.device import select_backend
    from hwbench.device_check import device_peak, identify_device
    from hwbench.units import GIB

    catalog = load_catalog()
    entries = sorted(catalog.devices.values(), key=lambda d: (d.vendor, d.name))
    rows = []
    for entry in entries:
        memory = f"{entry.memory_bytes / GIB:g} GiB" if entry.memory_bytes else "from device"
        rows.append(
            [entry.name, entry.backend, entry.title, memory,
             *(_peak_cell(entry.peak_flops[p]) if p in entry.peak_flops else "not listed" for p in PEAK_PRECISIONS)]
        )
    print(tabulate(rows, headers=["entry", "backend", "model", "memory", *(f"{p} TFLOP/s" for p in PEAK_PRECISIONS)]))
    print("\nDense peaks per device. * the source lists the figure with sparsity; the dense figure is half of it.")
    print("\nSources:")
    for entry in entries:
        for precision, figure in entry.peak_flops.items():
            where = (
                f"{figure.source} (read {figure.read})" if figure.dense is not None else f"null: {figure.unavailable}"
            )
            print(f"  {entry.name} {precision}: {where}")

    backend = select_backend("auto")
    names = ", ".join(backend.device_names())
    print(f"\nThis machine: --device auto uses {backend.name} ({backend.device_count()} x {names})")
    model_name, found = identify_device(backend, catalog)
    print(f"  catalog entry: {found.entry.name if found.entry else 'none'} ({found.why})")
    for precision in PEAK_PRECISIONS:
        peak, reason, basis = device_peak(backend, found.entry, precision, found.why)
        print(f"  {precision} peak: " + (f"{peak / 1e12:g} TFLOP/s ({basis})" if peak else f"null ({reason})"))
    for reason in backend.passed_over:
        print(f"  passed over {reason}")
    return 0
