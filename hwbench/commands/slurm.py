"""`hwbench slurm`: print the sbatch script that runs `hwbench run` on a Slurm cluster
(docs/slurm.md), for users who submit by hand, as `hwbench k8s` prints a manifest.
Options not listed here are `hwbench run` options, checked as the nodes will check
them and passed to every task."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from hwbench.errors import UsageError
from hwbench.options import MULTI_NODE_PORT

DESCRIPTION = ("Print the sbatch script that runs `hwbench run` on --nnodes nodes of a Slurm cluster. Options not "
               "listed here are `hwbench run` options, passed to every task.")
LOG_NAME = "hwbench-%j.log"  # in the folder sbatch is run from; %j: the job id
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
    parser.add_argument("--log", default=LOG_NAME, help=f"#SBATCH --output (default: {LOG_NAME.replace('%', '%%')})")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]):
    """(script settings, the RunSpec, the run arguments), validated."""
    from hwbench.commands.run import parse_run_spec
    from hwbench.harness.slurm import SlurmSettings

    args, run_args = parser.parse_known_args(list(argv))
    for token in run_args:
        if token.split("=", 1)[0] in SET_BY_SLURM:
            raise UsageError(f"{token.split('=', 1)[0]} is not accepted by `hwbench slurm`; under srun the node rank "
                             "and the rendezvous come from Slurm (the job's first host, a port from the job id)")
    nnodes_given = any(token.split("=", 1)[0] == "--nnodes" for token in run_args)
    launch = ["--master-port", str(MULTI_NODE_PORT)] if nnodes_given else []  # a stand-in: nodes take Slurm's
    spec = parse_run_spec([*run_args, *launch], check_paths=False)
    settings = SlurmSettings(partition=args.partition, account=args.account, time=args.time,
                             sbatch_args=tuple(args.sbatch_arg), launch=args.launch)
    name = args.job_name or f"hwbench-{spec.model}-{spec.launch.nnodes}x{spec.launch.nproc_per_node}"
    return settings, spec, run_args, name, args.log


def main(parsed) -> int:
    from hwbench.harness.slurm import batch_script

    settings, spec, run_args, name, log = parsed
    sys.stdout.write(batch_script(spec, _without_out(run_args), spec.out_dir, log, settings, job_name=name))
    return 0


def _without_out(run_args: list[str]) -> list[str]:
    """The run arguments less --out (the script names it once, as the sweep's scripts do)."""
    kept, skip = [], False
    for token in run_args:
        if skip:
            skip = False
            continue
        if token == "--out":
            skip = True
            continue
        if not token.startswith("--out="):
            kept.append(token)
    return kept
