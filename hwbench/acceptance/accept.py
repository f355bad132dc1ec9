"""`hwbench accept`'s flow: each device's health read first (acceptance/health.py: a failing device
is a FAIL before anything is measured), then each device of this host probed alone (device_probe.py; under Slurm
each device of every node of the partition, node_probes.py), then every
point of a suite through the sweep's executors (local, or each point a Slurm job), then the
judgement against the baseline (hwbench/judge/accept.py) written as one page. Everything is
checked before anything is measured; every result stays where a sweep puts it (OUT/<suite>/)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from hwbench.acceptance.device_probe import MAX_PROBE_TIME_S
from hwbench.acceptance.fabric import FabricOptions
from hwbench.acceptance.health import failing, health_lines, read_node_health
from hwbench.device.health import NodeHealth
from hwbench.errors import UsageError
from hwbench.harness.preflight import PreflightReport
from hwbench.judge.accept import DEFAULT_MIN_RATIO, DEFAULT_OUTLIER, Acceptance, judge
from hwbench.paths import check_output_folder
from hwbench.report.accept import render
from hwbench.suites.executor import SweepOptions, progress_lines

PAGE_FORMATS = ("md", "html")
DEFAULT_PROBE_TIME_S = 0.5  # each probe measurement's repetitions together: short, the spread shows the noise


@dataclasses.dataclass(frozen=True)
class AcceptOptions:
    suite: str
    baseline: str
    out_dir: Path
    min_ratio: float = DEFAULT_MIN_RATIO
    outlier: float = DEFAULT_OUTLIER
    repeats: int = 1
    device: str | None = None
    devices_per_node: int | None = None  # devices to probe on this host; None: as many as the backend has
    probe_time_s: float = DEFAULT_PROBE_TIME_S
    page_format: str = "md"
    preflight: bool = True
    fabric: FabricOptions = FabricOptions()  # used when the baseline holds collectives

    def __post_init__(self) -> None:
        if not isinstance(self.out_dir, (str, os.PathLike)) or not os.fspath(self.out_dir).strip():
            # checked before Path(), which reads "" as the current folder
            raise UsageError(f"--out {self.out_dir!r} is not accepted; give a directory (it is created when missing)")
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        if not _number(self.min_ratio) or not 0 < self.min_ratio <= 10:
            raise UsageError(f"--min-ratio {self.min_ratio!r} is not accepted; give a number above 0 (0.95)")
        if not _number(self.outlier) or not 0 <= self.outlier < 1:
            raise UsageError(f"--outlier {self.outlier!r} is not accepted; give a fraction from 0 to below 1 (0.05)")
        if self.page_format not in PAGE_FORMATS:
            raise UsageError(f"--format {self.page_format!r} is not accepted; accepted: {', '.join(PAGE_FORMATS)}")
        if self.devices_per_node is not None and self.devices_per_node < 1:
            raise UsageError(f"--devices-per-node {self.devices_per_node!r} is not accepted; give an integer >= 1")
        if not _number(self.probe_time_s) or not 0 < self.probe_time_s <= MAX_PROBE_TIME_S:
            # above the bound every probe would end as "no answer within 600 s", after 600 s each
            raise UsageError(f"--probe-time {self.probe_time_s!r} is not accepted; give seconds above 0, at most "
                             f"{MAX_PROBE_TIME_S:g}")

    @property
    def page(self) -> Path:
        return self.out_dir / f"accept.{self.page_format}"


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_devices_per_node(count: int | None, backend) -> None:
    """At most the devices the backend sees (a probe of a device it lacks can only fail); on the
    CPU, which is one device, at most the usable cores (each probe is one thread: more only
    repeats the same cores, one after another: 100,000 of them ran for hours)."""
    if count is None:
        return
    from hwbench.device.host import usable_cores

    most, what = ((usable_cores(), "usable cores") if backend.name == "cpu"
                  else (backend.device_count(), f"devices the {backend.name} backend sees"))
    if count > most:
        raise UsageError(f"--devices-per-node {count} is not accepted: this host has {most} {what}; "
                         f"give 1 to {most}")


def probe_device(device: str | None, suite) -> str:
    """The device kind the Slurm nodes are probed on: --device, else the one its points name
    (a probe job asks Slurm for the devices by kind, as each point's job does)."""
    from hwbench.suites.slurm import check_device_kind

    named = {point.option("device") for point in suite.points} - {None}
    kind = device or (named.pop() if len(named) == 1 else None)
    check_device_kind(kind, "the probes of --executor slurm (give --device, or one device kind in every point)")
    return str(kind)


def accept(options: AcceptOptions, slurm=None, progress: bool = True,
           before: Callable[[], PreflightReport | None] = lambda: None) -> tuple[Acceptance, Path]:
    """The acceptance, and the page written; UsageError or SetupError before anything is measured
    or written. ``before``: called once the input is checked, before the first measurement (the
    command's preflight: the report it made, whose warnings the page shows, or None). When the
    baseline holds collectives, they are measured on this node after the probes (acceptance/fabric.py)."""
    from hwbench.acceptance.device_probe import probe_devices
    from hwbench.acceptance.fabric import fabric_jobs, measure_fabric
    from hwbench.acceptance.node_probes import check_node_devices, partition_nodes
    from hwbench.device import select_backend
    from hwbench.judge.baseline import load_baseline
    from hwbench.suites.slurm import check_script_value
    from hwbench.suites.suite import find_suite, load_suite
    from hwbench.suites.sweep import run_sweep

    suite = load_suite(find_suite(options.suite))
    baseline = load_baseline(options.baseline)
    sweep = SweepOptions(out_dir=options.out_dir, device=options.device, repeats=options.repeats,
                         preflight=options.preflight)
    check_output_folder(options.out_dir)
    jobs = fabric_jobs(baseline.collectives, options.device, options.fabric)
    if jobs and slurm is not None:  # they would run on this host, not on the partition's nodes
        raise UsageError("--executor slurm with a baseline that holds collectives: hwbench accept measures the "
                         "collectives on this node only; give a baseline without them, or run locally")
    backend, nodes, device = None, [], ""  # this host's backend, or the Slurm nodes and their device kind
    if slurm is None:
        backend = select_backend(options.device or "auto")  # SetupError here when the machine lacks it
        check_devices_per_node(options.devices_per_node, backend)
    else:
        check_script_value("--out", str(options.out_dir.resolve()))  # in every probe job's script
        device = probe_device(options.device, suite)
        nodes = partition_nodes(slurm.partition)  # SetupError here when Slurm does not answer
        check_node_devices(nodes, device, options.devices_per_node)
    checked_first = before()
    say = progress_lines(progress)
    health, probes = _health(options, slurm, say, backend, nodes, device)
    if failing(health):  # nothing more is measured on a system with a device known faulty: its figures are not its
        acceptance = judge(probes, [], baseline, options.min_ratio, options.outlier, checked_first, None, health)
        options.out_dir.mkdir(parents=True, exist_ok=True)
        options.page.write_text(render(acceptance, options.page_format))
        return acceptance, options.page
    if backend is not None:  # this host's devices (not Slurm's nodes), probed now that none is known faulty
        probes = probe_devices(backend.name, options.devices_per_node or backend.device_count(),
                               options.probe_time_s, options.out_dir, say)
    fabric = measure_fabric(jobs, options.out_dir, say)
    records = run_sweep(suite, sweep, slurm=slurm, progress=progress)
    acceptance = judge(probes, [(r.point.name, r.results) for r in records], baseline,
                       options.min_ratio, options.outlier, checked_first, fabric, health)
    options.page.write_text(render(acceptance, options.page_format))
    return acceptance, options.page


def _health(options: AcceptOptions, slurm, say, backend, nodes: list, device: str
            ) -> tuple[list[NodeHealth], list[dict]]:
    """Each node's devices' health, read before anything is timed, said; and under Slurm each
    device's probe, which each node's job runs only after reading its own health as good
    (acceptance/node_probes.py). Locally no probe yet: the caller probes this host's devices once
    it has judged their health."""
    from hwbench.acceptance.node_probes import probe_nodes

    probes: list[dict] = []
    if slurm is not None:
        probes, health = probe_nodes(nodes, device, options.devices_per_node, options.probe_time_s,
                                     options.out_dir, slurm, say)
    else:
        health = [read_node_health(backend.name)]
    for line in health_lines(health):
        say(line)
    return health, probes
