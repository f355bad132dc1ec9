"""`hwbench accept --executor slurm`: every node of the sweep's partition probed, each by a
Slurm job of its own (docs/accept.md).

The nodes come from ``sinfo``; each gets one exclusive job pinned to it (``--nodelist``),
written as ``OUT/probes/<node>.sbatch`` with its log beside it. The job runs this module on
the node, which probes each device of the node alone, one after another
(hwbench/acceptance/device_probe.py: one `python -m hwbench.acceptance.device_probe` a device),
its records in ``OUT/probes/<node>.jsonl``; before that it reads the node's devices' health
(acceptance/health.py) into ``OUT/probes/<node>.health.json``, and probes nothing when a device
fails it. They are gathered into OUT/probes.jsonl, each with
the Slurm node's name (``node``). A node that is down, whose job is refused, fails, or does not
end in time is a record of the node (``index`` null) with its cause: a FAIL, never a crash, and
what its devices had measured before is kept. Only Slurm's client tools are used (sinfo,
sbatch, scontrol, scancel), through hwbench/suites/slurm.py.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from hwbench.acceptance.device_probe import PROBE_TIMEOUT_S, PROBES_FILE, append_records, failed_record, probe_devices
from hwbench.device.health import NodeHealth, readings_from_dict
from hwbench.device.kinds import KINDS
from hwbench.errors import SetupError, UsageError
from hwbench.files import write_text_atomic
from hwbench.suites.slurm import (
    ACTIVE_STATES,
    NO_ANSWER,
    SlurmSettings,
    job_state,
    sbatch_header,
    slurm_time,
    slurm_tool,
    submit,
)

PROBE_FOLDER = "probes"  # OUT/probes/<node>.sbatch, .log, .jsonl
# sinfo's short states of a node that runs no job: its probe could only wait
UNUSABLE_STATES = ("down", "drain", "drng", "fail", "failg", "maint", "boot", "powered_down", "pow_dn", "unk",
                   "npc", "futr", "inval", "reboot", "resv_del")
DEFAULT_NODE_DEVICES = 8  # the job's --time when a node's device count is not known from sinfo
PENDING_MARGIN_S = 300.0  # beyond the job's own time limit, how long a probe job may wait to start


def partition_nodes(partition: str | None) -> list[dict[str, Any]]:
    """Every node of ``partition`` (the default partition when None): its name, sinfo's short
    state, its generic resources and CPUs; SetupError when sinfo does not answer."""
    command = ["sinfo", "-h", "-N", "-o", "%N|%t|%G|%c"] + (["-p", partition] if partition else [])
    done = slurm_tool(command)
    if done.returncode != 0:
        raise SetupError(f"sinfo failed, so the nodes to probe are not known: "
                         f"{(done.stderr.strip().splitlines() or [f'exit status {done.returncode}'])[-1]}")
    nodes: dict[str, dict[str, Any]] = {}
    for line in done.stdout.splitlines():
        name, state, gres, cpus = (line.strip().split("|") + ["", "", ""])[:4]
        if name and name not in nodes:  # a node of several partitions is listed once a partition
            nodes[name] = {"node": name, "state": state.rstrip("*~#!%$@^-"), "gres": gres,
                           "cpus": int(cpus) if cpus.isdigit() else None}
    if not nodes:
        raise UsageError(f"--partition {partition!r} is not accepted: sinfo lists no node in it; give a partition "
                         "of this cluster (sinfo lists them)" if partition else "sinfo lists no node to probe")
    return list(nodes.values())


def gres_count(gres: str, name: str) -> int | None:
    """The count of ``name`` (gpu) in sinfo's %G (``gpu:h100:8(S:0-1),shard:2``), or None."""
    counts = [int(m.group(1)) for m in re.finditer(rf"(?:^|,){re.escape(name)}(?::[^:,(]+)*?:(\d+)", gres)]
    return sum(counts) if counts else None


def node_devices(node: dict[str, Any], device: str, count: int | None) -> int | None:
    """The devices ``node``'s job probes: ``count``, else those of the kind sinfo reports (the
    CPU: one), else None (not known here: the node's backend tells)."""
    gres = KINDS[device].slurm_gres if device in KINDS else None
    return count or (gres_count(node["gres"], gres) if gres else 1)


def check_node_devices(nodes: list[dict[str, Any]], device: str, count: int | None) -> None:
    """--devices-per-node at most what each node has, as sinfo reports it: the devices of the kind,
    or on the CPU its CPUs (each probe is one thread); a node whose count sinfo does not give is
    left to its job."""
    if count is None:
        return
    gres = KINDS[device].slurm_gres if device in KINDS else None
    for node in nodes:
        most = gres_count(node["gres"], gres) if gres else node.get("cpus")
        if most is not None and count > most:
            what = f"{gres} devices" if gres else "CPUs"
            raise UsageError(f"--devices-per-node {count} is not accepted: Slurm reports {most} {what} on node "
                             f"{node['node']}; give 1 to {most}")


def probe_script(node: dict[str, Any], device: str, count: int | None, min_time_s: float, folder: Path,
                 settings: SlurmSettings) -> str:
    """The sbatch script that probes every device of ``node`` (``count``: that many; None: as many
    as its backend sees), exclusive so that nothing else runs there meanwhile."""
    gres = KINDS[device].slurm_gres if device in KINDS else None
    devices = node_devices(node, device, count)
    sbatch: dict[str, Any] = {"job-name": f"hwbench-probe-{node['node']}", "nodelist": node["node"], "nodes": 1,
                              "ntasks": 1, "exclusive": None, "output": folder / f"{node['node']}.log",
                              "time": slurm_time(_time_limit_s(devices))}
    if gres and devices:
        sbatch["gres"] = f"{gres}:{devices}"
    lines = sbatch_header(sbatch, settings)
    command = [settings.python, "-m", "hwbench.acceptance.node_probes", device, str(min_time_s),
               str(folder / f"{node['node']}.jsonl")] + ([str(count)] if count else [])
    lines += ["", "# written by hwbench accept: each device of this node probed alone, one after another",
              shlex.join(command), ""]
    return "\n".join(lines)


def probe_nodes(nodes: list[dict[str, Any]], device: str, count: int | None, min_time_s: float, out_dir: Path,
                settings: SlurmSettings, say=lambda text: None) -> tuple[list[dict[str, Any]], list[NodeHealth]]:
    """Every node (partition_nodes) probed by its own job, all at once; their records (and one
    record with the cause for each node that gave none) appended to OUT/probes.jsonl; and each
    node's devices' health, which its job read before probing (a node with a failing device is
    not probed: its health names why)."""
    folder = (out_dir / PROBE_FOLDER).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    jobs: dict[str, str] = {}  # node -> job id
    failed: dict[str, str] = {}  # node -> why it gave no records
    limit_s = max(_time_limit_s(node_devices(node, device, count)) for node in nodes)
    for node in nodes:
        (folder / f"{node['node']}.jsonl").unlink(missing_ok=True)  # an earlier accept's records are not this one's
        health_file(folder / f"{node['node']}.jsonl").unlink(missing_ok=True)
        job_id, cause = _submit_probe(node, device, count, min_time_s, folder, settings)
        if job_id is None:
            failed[node["node"]] = cause
        else:
            jobs[node["node"]] = job_id
            say(f"probing the devices of node {node['node']}: job {job_id}")
    try:
        failed.update(_wait(jobs, limit_s + PENDING_MARGIN_S, settings.poll_s))
    except BaseException:  # Ctrl-C while waiting: no exclusive probe job is left holding its node
        slurm_tool(["scancel", *jobs.values()])
        raise
    return _gather(folder, out_dir, sorted(set(jobs) | set(failed)), failed, device)


def _submit_probe(node: dict[str, Any], device: str, count: int | None, min_time_s: float, folder: Path,
                  settings: SlurmSettings) -> tuple[str | None, str]:
    """(the probe job's id, '') or (None, why the node is not probed)."""
    if node["state"] in UNUSABLE_STATES:
        return None, f"Slurm reports the node {node['state']}; not probed"
    script = write_text_atomic(folder / f"{node['node']}.sbatch",
                               probe_script(node, device, count, min_time_s, folder, settings))
    job_id, problem = submit(script)
    return (job_id, "") if job_id else (None, f"sbatch refused its probe job: {problem}")


def _time_limit_s(devices: int | None) -> float:
    """A probe job's time limit: each device's probe bound (PROBE_TIMEOUT_S), one after another
    (the sweep's --time is for its points, not for these jobs)."""
    return (devices or DEFAULT_NODE_DEVICES) * PROBE_TIMEOUT_S


def _wait(jobs: dict[str, str], limit_s: float, poll_s: float) -> dict[str, str]:
    """Each job polled until it ended; the nodes whose job did not complete, with the cause. A job
    still out after ``limit_s`` is cancelled and named as not answering."""
    deadline, out, failed = time.monotonic() + limit_s, dict(jobs), {}
    while out:
        for name, job_id in list(out.items()):
            state = job_state(job_id) or "UNKNOWN"
            if state in ACTIVE_STATES or state == NO_ANSWER:
                continue
            del out[name]
            if state != "COMPLETED":
                failed[name] = f"probe job {job_id} ended {state}"
        if out and time.monotonic() > deadline:  # still pending (the node busy or gone): named, not waited for
            slurm_tool(["scancel", *out.values()])
            failed.update({name: f"probe job {job_id} did not end within {limit_s:g} s; cancelled"
                           for name, job_id in out.items()})
            break
        if out:
            time.sleep(poll_s)
    return failed


def _gather(folder: Path, out_dir: Path, nodes: list[str], failed: dict[str, str], device: str
            ) -> tuple[list[dict[str, Any]], list[NodeHealth]]:
    records: list[dict[str, Any]] = []
    health: list[NodeHealth] = []
    for name in nodes:
        read = _read_health(name, health_file(folder / f"{name}.jsonl"))
        health += [read] if read is not None else []
        found = _read_records(folder / f"{name}.jsonl")
        node_records = [{**record, "node": name} for record in found]
        unprobed = read is not None and read.failed  # not probed by design: its health names the device
        cause = failed.get(name) or (None if found or unprobed else "its probe job wrote no record")
        if cause:
            node_records.append(failed_record(name, device, None, cause + _log_tail(folder / f"{name}.log"),
                                              node=name))
        append_records(out_dir / PROBES_FILE, node_records)
        records += node_records
    return records, health


def _read_health(node: str, path: Path) -> NodeHealth | None:
    """The health read a node's job kept; None when it kept none (its job did not start, or failed
    before), or one that cannot be read (the node's records say why)."""
    try:
        return NodeHealth(node, readings_from_dict(json.loads(path.read_text())))
    except (OSError, ValueError):
        return None


def _read_records(path: Path) -> list[dict[str, Any]]:
    """The lines a node's probe wrote; a line cut short (the job killed mid-write) is left out."""
    try:
        text = path.read_text()
    except OSError:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def _log_tail(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f" (its log: {lines[-1].strip()})" if lines else ""


def main(argv: list[str] | None = None) -> int:
    """On a node, in its probe job: each device of this node probed, records into OUT."""
    parser = argparse.ArgumentParser(prog="python -m hwbench.acceptance.node_probes")
    parser.add_argument("device")
    parser.add_argument("min_time_s", type=float)
    parser.add_argument("out", type=Path, help="the node's records, one a line")
    parser.add_argument("count", type=int, nargs="?", help="devices to probe (default: as many as the backend has)")
    args = parser.parse_args(argv)
    try:
        from hwbench.device import select_backend

        count = args.count or select_backend(args.device).device_count()
    except SetupError as error:  # the node lacks the device: the cause in one line, the last the log has
        print(error, file=sys.stderr)
        return 2
    if not read_health_first(args.device, health_file(args.out)):
        return 0  # a failing device: named in the health file, nothing measured on this node
    probe_devices(args.device, count, args.min_time_s, args.out.parent, records_file=args.out.name)
    return 0


def health_file(records: Path) -> Path:
    """OUT/probes/<node>.health.json beside the node's records: its devices' health read."""
    return records.with_name(records.name.removesuffix(".jsonl") + ".health.json")


def read_health_first(device: str, path: Path) -> bool:
    """This node's devices read (acceptance/health.py) and kept in ``path`` for `hwbench accept`,
    each failure and warning in the job's log; False when a device fails (nothing is to be measured)."""
    from hwbench.acceptance.health import health_lines, read_node_health
    from hwbench.device.health import readings_to_dict

    health = read_node_health(device)
    write_text_atomic(path, json.dumps(readings_to_dict(health.readings)))
    for line in health_lines([health]):
        print(line, file=sys.stderr)
    return not health.failed


if __name__ == "__main__":
    raise SystemExit(main())
