"""How many devices a run is charged for, and whether it had them to itself.

Results written since issue 16 record both (`environment.devices_used` with its basis,
`environment.oversubscribed` with its reason). Older results do not: then what the result does
record decides (docs/reports.md, "Devices counted as devices")."""

from __future__ import annotations

from typing import Any

from hwbench.results import RunResult

ONE_SOCKET_PER_NODE = "assumed: one CPU socket per node (the result does not record devices_used)"


def devices_charged(result: RunResult, world: int) -> tuple[int, str]:
    """(devices to charge, how that count was found). Ranks that share one CPU socket are one
    device; a GPU or NPU run is charged one device per rank."""
    environment = result.environment or {}
    used = environment.get("devices_used")
    if isinstance(used, int) and not isinstance(used, bool) and used >= 1:
        return used, environment.get("devices_used_basis") or "recorded by the run (environment.devices_used)"
    if _backend(result) == "cpu":
        return _nodes(result), ONE_SOCKET_PER_NODE
    return world, "one device per rank (world size)"


def oversubscription(result: RunResult) -> tuple[bool | None, str | None]:
    """(True, why) when the run's ranks x threads per rank exceeded the usable cores or its
    devices were shared; (False, None) when it had them to itself; (None, why) when unknown."""
    environment = result.environment or {}
    recorded = environment.get("oversubscribed")
    if isinstance(recorded, bool):
        return recorded, environment.get("oversubscribed_reason") if recorded else None
    if _backend(result) != "cpu":
        return None, "not recorded by the run"
    cores = environment.get("cpu_cores_usable")
    threads = _threads_per_rank(result)
    ranks = _ranks_per_node(result)
    if not isinstance(cores, int) or threads is None:
        return None, "the run recorded no usable cores or threads per rank"
    if ranks * threads > cores:
        return True, f"{ranks} ranks x {threads} threads per rank on {cores} usable cores"
    return False, None


def _threads_per_rank(result: RunResult) -> int | None:
    environment = result.environment or {}
    for value in (environment.get("threads_per_rank"), (environment.get("tuning") or {}).get("intra_op_threads"),
                  ((result.device or {}).get("tuning") or {}).get("intra_op_threads")):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def _launch(result: RunResult) -> dict[str, Any]:
    return (result.spec or {}).get("launch") or {}


def _ranks_per_node(result: RunResult) -> int:
    return int(_launch(result).get("nproc_per_node") or 1)


def _nodes(result: RunResult) -> int:
    return int(_launch(result).get("nnodes") or 1)


def _backend(result: RunResult) -> str | None:
    return (result.device or {}).get("backend") or (result.environment or {}).get("backend")
