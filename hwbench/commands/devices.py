"""`hwbench devices`: the hardware catalog, and the device this machine would use."""

from __future__ import annotations

import argparse

DESCRIPTION = "List the hardware catalog and the device this machine would use."


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from hwbench.catalog import load_catalog
    from hwbench.device import select_backend
    from hwbench.units import GIB

    rows = []
    for entry in sorted(load_catalog().devices.values(), key=lambda d: (d.vendor, d.name)):
        peaks = ", ".join(f"{k} {v / 1e12:g}" for k, v in entry.peak_flops.items() if v) or "none known"
        memory = f"{entry.memory_bytes / GIB:g} GiB" if entry.memory_bytes else "from device"
        rows.append([entry.name, entry.backend, entry.title, memory, peaks])
    print(tabulate(rows, headers=["entry", "backend", "model", "memory", "peak TFLOP/s (dense)"]))
    backend = select_backend("auto")
    names = ", ".join(backend.device_names())
    print(f"\nThis machine: --device auto uses {backend.name} ({backend.device_count()} x {names})")
    for reason in backend.passed_over:
        print(f"  passed over {reason}")
    return 0
