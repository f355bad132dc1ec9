"""Does asking torch for a GPU's name and properties (what `hwbench sweep` and the launcher do
for their estimate and plan) leave a CUDA context on the GPU, and does NVML list this process
under its own pid (not in a container whose PID namespace the driver ignores)? Two questions the
CPU cannot answer, settled on the card in seconds; `benchmarks/gpu_session.sh probe` runs it.

    python benchmarks/cuda_context_probe.py --out gpu-session/cuda_context.json

NVML's compute processes on device 0 are listed three times: before torch touches CUDA, after
torch.cuda.get_device_name/get_device_properties/is_bf16_supported (no allocation), and after
set_device and one allocation, as a rank does, which creates the context for certain. The JSON
says what each listing held; the last line says what follows for hwbench. Exit 0 when it could
tell, 1 when it could not (no GPU, no NVML: the reason in the file), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def compute_pids(nvml, handle) -> list[int]:
    return sorted(int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle))


def probe() -> dict:
    import pynvml
    import torch

    pid = os.getpid()
    if not torch.cuda.is_available():
        return {"pid": pid, "error": "torch.cuda.is_available() is False"}
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)  # the first GPU CUDA_VISIBLE_DEVICES leaves, or GPU 0
        listed = {"before torch": compute_pids(pynvml, handle)}
        torch.cuda.get_device_name(0)
        torch.cuda.get_device_properties(0)
        torch.cuda.is_bf16_supported()
        listed["after the name and properties"] = compute_pids(pynvml, handle)
        torch.cuda.set_device(0)  # as a rank does, then an allocation: a context for certain
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        listed["after one allocation"] = compute_pids(pynvml, handle)
    finally:
        pynvml.nvmlShutdown()
    new_after_query = set(listed["after the name and properties"]) - set(listed["before torch"])
    new_after_allocation = set(listed["after one allocation"]) - set(listed["before torch"])
    return {
        "pid": pid,
        "listed": listed,
        "context_after_query": bool(new_after_query),
        "listed_under_own_pid": pid in new_after_allocation,
        "listed_under_another_pid": sorted(new_after_allocation - {pid}),
    }


def verdict(found: dict) -> str:
    if "error" in found:
        return f"cuda_context_probe: could not tell: {found['error']}"
    query = ("the name and property queries CREATE a context: a sweep's or launcher's own process holds GPU memory "
             "while its points run (the points' preflight leaves their ancestors out of 'other processes')"
             if found["context_after_query"] else
             "the name and property queries create no context: a sweep's or launcher's process holds no GPU memory")
    pids = ("NVML lists this process under its own pid" if found["listed_under_own_pid"] else
            f"NVML lists this process under another pid {found['listed_under_another_pid']} (a container: "
            "the driver knows no PID namespaces; calibrate takes the one unseen pid for itself)")
    return f"cuda_context_probe: {query}; {pids}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not out.parent.is_dir():
        print(f"cuda_context_probe: --out {args.out!r}: its folder does not exist; give a file in a folder",
              file=sys.stderr)
        return 2
    try:
        found = probe()
    except Exception as error:  # no NVML, no driver: said in the file, not a traceback
        found = {"pid": os.getpid(), "error": f"{type(error).__name__}: {error}"}
    found["verdict"] = verdict(found)
    out.write_text(json.dumps(found, indent=2) + "\n")
    print(found["verdict"])
    return 1 if "error" in found else 0


if __name__ == "__main__":
    sys.exit(main())
