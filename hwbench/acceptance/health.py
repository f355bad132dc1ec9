"""`hwbench accept`'s first step: each device of a node as its management library reports it (NVML,
AMD SMI, npu-smi, HLML; the CPU's EDAC counts), judged by hwbench.device.health.judge_health, the
rules `hwbench preflight` shows too. Read without torch and before any timing: a device with
uncorrectable memory errors, a pending or failed retirement, a link down or a PCIe link narrower
than it allows is named before anything is measured, and nothing is measured on that node (its
figures would not be the device's)."""

from __future__ import annotations

import socket

from hwbench.device.health import NodeHealth


def read_node_health(kind: str) -> NodeHealth:
    """This node's devices of ``kind``, as its management library reads them; a library that cannot
    be read gives no device and the reason (DeviceReadings.reason), never an exception."""
    from hwbench.device.preflight import read_devices

    return NodeHealth(socket.gethostname(), read_devices(kind))


def failing(health: list[NodeHealth]) -> bool:
    return any(node.failed for node in health)


def health_lines(health: list[NodeHealth]) -> list[str]:
    """What accept says of the read before it measures."""
    return [f"device health: {line}" for node in health for line in node.lines()]
