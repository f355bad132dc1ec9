"""`hwbench run`: one benchmark point, in this process, as a torchrun job it
launches (--nproc-per-node / --nnodes), or as one rank of such a job (when torchrun
started this command)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Iterable, Sequence

from hwbench.errors import UsageError
from hwbench.options import (
    BY_NAME,
    FLAG,
    MEGATRON_CONSTANTS,
    MEGATRON_IGNORED,
    MEGATRON_INSTEAD,
    NEGATABLE,
    OPTION_NAMES,
    RUN_OPTIONS,
    RunOptions,
)

DESCRIPTION = ("Train one workload and measure it. Megatron-LM's names for the same options are accepted "
               "(--tensor-model-parallel-size, --train-iters, --fp16, ...), so a Megatron launch line's model "
               "and parallel flags can be pasted.")


def add_run_options(parser: argparse.ArgumentParser, megatron: bool = True) -> None:
    """Every run option, grouped as `hwbench run --help` shows them; with ``megatron``,
    Megatron-LM's names as aliases."""
    groups: dict[str, Any] = {"workload": parser}
    for option in RUN_OPTIONS:
        group = groups.get(option.group) or groups.setdefault(option.group, parser.add_argument_group(option.group))
        flags = [option.flag, *(option.megatron if megatron else ())]
        if option.switch == NEGATABLE:
            group.add_argument(*flags, dest=option.name, action=argparse.BooleanOptionalAction, default=None,
                               help=option.help)
        elif option.switch == FLAG:
            group.add_argument(*flags, dest=option.name, action="store_true", default=None, help=option.help)
        else:
            group.add_argument(*flags, dest=option.name, type=option.type, choices=option.choices, default=None,
                               help=option.help, metavar=option.metavar)
    if megatron:
        aliases = parser.add_argument_group("Megatron-LM's names (accepted as they are)")
        for flag, (name, value) in MEGATRON_CONSTANTS.items():
            aliases.add_argument(flag, dest=name, action="store_const", const=value,
                                 help=f"as {BY_NAME[name].flag} {value if not isinstance(value, bool) else ''}".strip())
        for flag, reason in MEGATRON_IGNORED.items():
            aliases.add_argument(flag, dest="ignored_" + flag[2:].replace("-", "_"), metavar="PATH",
                                 help=f"accepted and not used: {reason}")


def refuse_unsupported_megatron_flags(argv: Iterable[str]) -> None:
    """A Megatron flag hwbench does not take is named with what to use instead (argparse
    would only say "unrecognized arguments")."""
    for item in argv:
        flag = item.split("=", 1)[0]
        if flag in MEGATRON_INSTEAD and MEGATRON_INSTEAD[flag]:
            raise UsageError(f"{flag} is Megatron-LM's, and hwbench does not take it: {MEGATRON_INSTEAD[flag]}")


def options_from_namespace(args: argparse.Namespace) -> RunOptions:
    return RunOptions(**{name: getattr(args, name, None) for name in OPTION_NAMES})


def configure(parser: argparse.ArgumentParser) -> None:
    add_run_options(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress display")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    refuse_unsupported_megatron_flags(argv)
    return parser.parse_args(list(argv))


def parse_run_spec(run_argv: Sequence[str], check_paths: bool = True):
    """The RunSpec that `hwbench run RUN_ARGV...` would run (UsageError when it would
    refuse them). ``check_paths=False`` for a run on another machine (a pod)."""
    from hwbench.catalog import load_catalog
    from hwbench.cli import command_parser
    from hwbench.spec import build_run_spec

    _, parser = command_parser("run")
    return build_run_spec(options_from_namespace(parse(parser, run_argv)), load_catalog(), check_paths=check_paths)


def main(args: argparse.Namespace) -> int:
    from hwbench.catalog import load_catalog
    from hwbench.engine.distributed import RankEnvironment
    from hwbench.fast import resolve_settings
    from hwbench.harness.faults import Fault
    from hwbench.spec import build_run_spec

    options = options_from_namespace(args)
    catalog = load_catalog()
    rank_env = RankEnvironment.from_environ()
    if rank_env is None:  # under srun: Slurm's ranks (hwbench.harness.slurm_env, docs/slurm.md)
        options, rank_env = _under_slurm(options)
    spec = build_run_spec(options, catalog, torchrun_world_size=rank_env.world_size if rank_env else None)
    spec = resolve_settings(spec, options, catalog)  # --settings fast: chosen for this device's memory
    if spec.settings_choice and rank_env is None:
        print(f"hwbench: note: --settings {spec.settings_choice}", file=sys.stderr)
    Fault.from_environ(spec.launch.world_size, spec.warmup + spec.steps)  # a drill it can never meet: refused
    if rank_env is not None:
        from hwbench.harness.worker import run_as_rank

        return _stored(*run_as_rank(spec, catalog, rank_env, show_progress=not args.quiet))
    from hwbench.harness.launcher import recover_stranded_runs

    for note in recover_stranded_runs():  # folders of launchers that were killed (docs/reliability.md)
        print(f"hwbench: note: {note}", file=sys.stderr)
    if spec.launch.world_size > 1 or spec.launch.nnodes > 1:
        from hwbench.harness.launcher import launch

        result = launch(spec, _rank_argv(options, spec, args.quiet), catalog)
        if result is None:
            print(f"node {spec.launch.node_rank}: its ranks finished; node 0 writes the result")
            return 0
    else:
        from hwbench.harness.worker import run_point

        result = run_point(spec, catalog, show_progress=not args.quiet)
    for reason in (result.device or {}).get("auto_passed_over") or ():
        print(f"hwbench: note: --device auto passed over {reason}; this run used the "
              f"{(result.device or {}).get('backend')}", file=sys.stderr)
    from hwbench.harness.sweep import SWEEP_ENV
    from hwbench.results import store_result

    if os.environ.get(SWEEP_ENV):  # hwbench sweep ran this point: say which (hwbench.harness.sweep)
        result.sweep = json.loads(os.environ[SWEEP_ENV])
    return _stored(result, store_result(result, spec.out_dir))


def _under_slurm(options: RunOptions):
    """(options, rank environment) for a run started by srun: each task one rank (it
    gets torchrun's variables), or each task one node of the torchrun job hwbench
    launches (--nproc-per-node G with one task per node); unchanged elsewhere."""
    from hwbench.engine.distributed import RankEnvironment
    from hwbench.harness.slurm_env import SlurmTask, slurm_mode

    task = SlurmTask.from_environ()
    mode = slurm_mode(task, options.given())
    if mode == "task":
        os.environ.update(task.torchrun_environment(os.environ))
        return options, RankEnvironment.from_environ()
    if mode == "node":
        return options.merged(**task.node_launch_options(os.environ)), None
    return options, None


def _rank_argv(options: RunOptions, spec, quiet: bool) -> list[str]:
    """What every rank runs: the same options (under --settings fast, with the memory this
    process planned for), as `hwbench run` arguments."""
    from hwbench.fast import rank_options

    return rank_options(options, spec).to_argv() + (["--quiet"] if quiet else [])


def _stored(result, stored) -> int:
    """Print the summary (or the JSON when no file took it); the exit status."""
    if result is None:  # a rank other than 0, or rank 0 writing into the launcher's run folder
        return 0
    from hwbench.report.summary import run_summary_table

    print(stored.text if stored.path is None else run_summary_table(result, str(stored.path)))
    if stored.problem:
        print(f"hwbench: error: {stored.problem}", file=sys.stderr)
        return 1
    return 0 if result.status == "ok" else 1
