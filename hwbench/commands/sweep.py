"""`hwbench sweep SUITE`: every point of a suite, each isolated, resumable (docs/sweeps.md)."""

from __future__ import annotations

import argparse
import sys
import warnings

from hwbench.device.kinds import DEVICE_CHOICES
from hwbench.errors import UsageError
from hwbench.options import RUN_OPTIONS
from hwbench.suites.suite import shipped_suite_names

DESCRIPTION = "Run every point of a suite, each in its own process tree; resumable (docs/sweeps.md)."


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", metavar="SUITE", help="a suite file, or a shipped suite: "
                        f"{', '.join(shipped_suite_names())}")
    parser.add_argument("--device", choices=DEVICE_CHOICES, help="for every point that does not set its own")
    parser.add_argument("--nproc-per-node", type=int, help="for every point that does not set its own")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each point (1 to 1000), with seeds seed, seed+1, ... (default: 1)")
    out = RUN_OPTIONS["out"].default  # as `hwbench run`'s
    parser.add_argument("--out", default=out, help=f"results go to OUT/<suite>/<point>/ (default: {out})")
    parser.add_argument("--force", action="store_true", help="run points again whose results already exist")
    parser.add_argument("--no-plan", dest="plan", action="store_false",
                        help="run points the memory planner predicts will not fit")
    parser.add_argument("--wait", action="store_true",
                        help="when another sweep is writing the same suite folder, wait for it instead of refusing")
    parser.add_argument("--quiet", action="store_true", help="no line per point")
    parser.add_argument("--no-preflight", dest="preflight", action="store_false",
                        help="check nothing first: neither the machine before the sweep nor before each point "
                             "(hwbench preflight; each point's result holds its readings otherwise)")
    add_slurm_options(parser)


def add_slurm_options(parser: argparse.ArgumentParser) -> None:
    """--executor and the Slurm executor's options (`hwbench sweep`, `hwbench accept`)."""
    slurm = parser.add_argument_group("Slurm (--executor slurm: every point one Slurm job; docs/slurm.md)")
    slurm.add_argument("--executor", choices=("local", "slurm"), default="local",
                       help="local: one point after another on this machine (default); slurm: each point an sbatch "
                            "job")
    slurm.add_argument("--partition", help="sbatch --partition for every job")
    slurm.add_argument("--account", help="sbatch --account for every job")
    slurm.add_argument("--time", help="sbatch --time for every job (default: each point's --timeout plus 2 minutes)")
    slurm.add_argument("--nodes-per-point", default="auto", metavar="auto|N",
                       help="nodes of a point that does not set --nnodes (default: auto, the point's own --nnodes)")
    slurm.add_argument("--sbatch-arg", action="append", default=[], metavar="OPTION",
                       help="one more sbatch option for every job, e.g. --sbatch-arg=--qos=high (repeatable)")
    slurm.add_argument("--launch", choices=("tasks", "torchrun"),
                       help="tasks: one Slurm task per device, each one rank (default); torchrun: one task per node "
                            "that starts the node's ranks")
    slurm.add_argument("--detach", action="store_true", help="submit the jobs and return; --collect gathers them")
    slurm.add_argument("--collect", action="store_true",
                       help="submit nothing: wait for the jobs of an earlier sweep and gather their results")
    slurm.add_argument("--poll", type=float, metavar="SECONDS",
                       help="how often Slurm is asked for the jobs' states (default: 10)")


def main(args: argparse.Namespace) -> int:
    from hwbench.report.summary import sweep_summary_table
    from hwbench.suites.executor import SweepInterrupted, SweepOptions
    from hwbench.suites.suite import find_suite, load_suite
    from hwbench.suites.sweep import run_sweep

    suite = load_suite(find_suite(args.suite))
    options = SweepOptions(out_dir=args.out, device=args.device, nproc_per_node=args.nproc_per_node,
                           repeats=args.repeats, force=args.force, plan=args.plan, wait=args.wait,
                           preflight=args.preflight)
    settings = slurm_settings(args)

    def before_start() -> None:  # once the sweep's input is checked: bad input stays one line
        if settings is not None:  # Slurm points run elsewhere: each estimates and checks its own node
            return
        from hwbench.cli import note
        from hwbench.commands.preflight import print_findings
        from hwbench.harness.run import machine_checked
        from hwbench.suites.sweep import before_sweep

        for line in before_sweep(suite, options, estimate=not args.quiet):  # slow precisions, duration
            note(f"hwbench: {line}")
        checked = machine_checked(args.device or "auto", args.out, args.nproc_per_node or 1) if args.preflight else None
        if checked is not None:
            print_findings(checked)

    try:
        with warnings.catch_warnings():  # a damaged earlier result: one line, not Python's file:line and source
            warnings.showwarning = _one_line_warning
            records = run_sweep(suite, options, slurm=settings, progress=not args.quiet, before_start=before_start)
    except SweepInterrupted as stop:
        if stop.jobs:
            return _interrupted_slurm(stop, options.out_dir / suite.name)
        print(f"hwbench: sweep stopped by {stop}; finished points are kept, the same command resumes", file=sys.stderr)
        return 128 + stop.signal_number
    except OSError as error:  # --out filled up or vanished mid-sweep: finished points are on disk
        print(f"hwbench: error: the sweep could not write to {args.out!r} ({error.strerror or error}); finished "
              "points are kept (a point's result may be in the temp folder: see its repeat*.log), the same command "
              "resumes", file=sys.stderr)
        return 1
    if settings is not None and settings.detach:
        out = [job for record in records for job in record.jobs]
        print(f"submitted; {len(out)} job(s) out ({', '.join(out) or 'none'}). "
              f"`hwbench sweep {args.suite} --executor slurm --out {args.out} --collect` gathers their results")
        return 0
    print(sweep_summary_table(suite, records))
    # run_sweep drops the runs that left no result; one left in would count as failed
    bad = [r for r in records if any(x is None or x.status not in ("ok", "skipped") for x in r.results)]
    return 1 if bad else 0


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: object = None, line: str | None = None) -> None:
    print(f"hwbench sweep: warning: {' '.join(str(message).split())}", file=sys.stderr)


def slurm_settings(args: argparse.Namespace):
    """The Slurm executor's settings, or None for a local sweep (whose Slurm options
    are then refused)."""
    slurm_only = [flag for flag, value in (
        ("--partition", args.partition), ("--account", args.account), ("--time", args.time),
        ("--detach", args.detach), ("--collect", args.collect), ("--sbatch-arg", args.sbatch_arg),
        ("--launch", args.launch), ("--poll", args.poll is not None),
        ("--nodes-per-point", args.nodes_per_point != "auto")) if value]
    if args.executor != "slurm":
        if slurm_only:
            raise UsageError(f"{slurm_only[0]} is accepted only with --executor slurm")
        return None
    from hwbench.suites.slurm import SlurmSettings

    nodes = args.nodes_per_point
    if nodes != "auto" and not (nodes.isascii() and nodes.isdigit() and int(nodes) >= 1):
        raise UsageError(f"--nodes-per-point {nodes!r} is not accepted; give auto or an integer >= 1")
    return SlurmSettings(partition=args.partition, account=args.account, time=args.time,
                         nodes_per_point=None if nodes == "auto" else int(nodes), sbatch_args=tuple(args.sbatch_arg),
                         launch=args.launch or "tasks", poll_s=10.0 if args.poll is None else args.poll,
                         detach=args.detach, collect=args.collect)


def _interrupted_slurm(stop, suite_dir) -> int:
    """Ctrl-C while Slurm jobs are out: ask whether to cancel them (at a terminal);
    otherwise they keep running and the same command re-attaches to them."""
    import signal

    from hwbench.suites.slurm import cancel_jobs

    jobs = ", ".join(stop.jobs)
    cancel = False
    if stop.signal_number == signal.SIGINT and sys.stdin.isatty():
        try:
            print(f"\ncancel the {len(stop.jobs)} Slurm job(s) still out ({jobs})? [y/N] ", end="", file=sys.stderr,
                  flush=True)
            cancel = input().strip().lower() in ("y", "yes")
        except (EOFError, KeyboardInterrupt):
            cancel = False
    if cancel:
        cancel_jobs(stop.jobs, suite_dir)
        print(f"hwbench: cancelled jobs {jobs}; finished points are kept, the same command submits the rest",
              file=sys.stderr)
    else:
        print(f"hwbench: sweep stopped by {stop}; jobs {jobs} keep running; the same command (or --collect) "
              f"re-attaches to them, `scancel {' '.join(stop.jobs)}` ends them", file=sys.stderr)
    return 128 + stop.signal_number
