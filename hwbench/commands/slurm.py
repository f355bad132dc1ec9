"""`hwbench slurm`: print the sbatch script that runs `hwbench run` on a Slurm cluster
(docs/slurm.md), for users who submit by hand, as `hwbench k8s` prints a manifest.
Options not listed here are `hwbench run` options, checked as the nodes will check
them and passed to every task."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hwbench.errors import UsageError
from hwbench.options import MULTI_NODE_PORT

DESCRIPTION = ("Print the sbatch script that runs `hwbench run` on --nnodes nodes of a Slurm cluster. Options not "
               "listed here are `hwbench run` options, passed to every task.")
LOG_NAME = "hwbench-%j.log"  # in the folder `hwbench slurm` is run from (made absolute); %j: the job id
SET_BY_SLURM = ("--node-rank", "--master-addr", "--master-port", "--rdzv-endpoint")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--partition", help="#SBATCH --partition")
    parser.add_argument("--account", help="#SBATCH --account")
    parser.add_argument("--time", help="#SBATCH --time (default: --timeout plus 2 minutes)")
    parser.add_argument("--sbatch-arg", action="append", default=[], metavar="OPTION",
                        help="one more #SBATCH line, e.g. --sbatch-arg=--qos=high (repeatable)")
    parser.add_argument("--launch", choices=("tasks", "torchrun"), default="tasks",
                        help="tasks: one Slurm task per device, each one rank (default); torchrun: one task per node "
                             "that starts the node's ranks")
    parser.add_argument("--job-name", default=None, help="#SBATCH --job-name (default: hwbench-<model>-<N>x<G>)")
    from hwbench.commands.run import run_option_flags

    parser.also_known = run_option_flags()  # type: ignore[attr-defined]  # a Parser's: the run options it passes on
    parser.add_argument("--log", default=LOG_NAME,
                        help=f"#SBATCH --output, absolute from this folder (default: {LOG_NAME.replace('%', '%%')})")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]):
    """(script settings, the RunSpec, the run options, the job name, the log), validated."""
    from hwbench.catalog import load_catalog
    from hwbench.commands.run import parse_run_options
    from hwbench.spec import build_run_spec
    from hwbench.suites.slurm import SlurmSettings

    args, run_args = parser.parse_known_args(list(argv))
    options = parse_run_options(run_args, outer=parser)
    for flag in SET_BY_SLURM:
        if getattr(options, flag[2:].replace("-", "_")) is not None:
            raise UsageError(f"{flag} is not accepted by `hwbench slurm`; under srun the node rank and the rendezvous "
                             "come from Slurm (the job's first host, a port from the job id)")
    launch = {"master_port": MULTI_NODE_PORT} if options.nnodes is not None else {}  # a stand-in: Slurm's port is used
    spec = build_run_spec(options.merged(**launch), load_catalog(), check_paths=False)
    settings = SlurmSettings(partition=args.partition, account=args.account, time=args.time,
                             sbatch_args=tuple(args.sbatch_arg), launch=args.launch)
    name = args.job_name or f"hwbench-{spec.model}-{spec.launch.nnodes}x{spec.launch.nproc_per_node}"
    return settings, spec, options, name, args.log


def main(parsed) -> int:
    from hwbench.suites.slurm import batch_script

    settings, spec, options, name, log = parsed
    sys.stdout.write(batch_script(spec, options, spec.out_dir, log, settings, job_name=name))
    return 0
