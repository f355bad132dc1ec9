"""`hwbench run`: one benchmark point, in this process, as a torchrun job it
launches (--nproc-per-node / --nnodes), or as one rank of such a job (when torchrun
started this command)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from hwbench.arguments import WORKLOAD
from hwbench.errors import UsageError
from hwbench.options import (
    MEGATRON_CONSTANTS,
    MEGATRON_IGNORED,
    MEGATRON_INSTEAD,
    RUN_OPTIONS,
    Option,
    RunOptions,
)

DESCRIPTION = ("Train one workload and measure it. Megatron-LM's names for the same options are accepted "
               "(--tensor-model-parallel-size, --train-iters, --fp16, ...), so a Megatron launch line's model "
               "and parallel flags can be pasted. docs/options.md lists every option.")


def add_run_options(parser: argparse.ArgumentParser, names: Iterable[str] | None = None,
                    megatron: bool = True) -> None:
    """Run options as arguments (all, or ``names``), grouped as `hwbench run --help` shows
    them; with ``megatron``, Megatron-LM's names as aliases. Each value is checked as it is
    parsed, by its definition."""
    chosen = list(RUN_OPTIONS if names is None else names)
    groups: dict[str, Any] = {WORKLOAD: parser}
    for option in (RUN_OPTIONS[name] for name in chosen):
        group = groups.get(option.group) or groups.setdefault(option.group, parser.add_argument_group(option.group))
        flags = [option.flag, *(option.megatron if megatron else ())]
        text = (option.help + _in_brackets(option)).replace("%", "%%")
        if option.type is bool:
            group.add_argument(*flags, dest=option.name, action=argparse.BooleanOptionalAction, default=None,
                               help=text)
        else:
            group.add_argument(*flags, dest=option.name, type=option.parse, default=None, help=text,
                               metavar="{" + ",".join(map(str, option.choices)) + "}" if option.choices else None)
    if megatron:
        aliases = parser.add_argument_group("Megatron-LM's names (accepted as they are)")
        for flag, (name, value) in MEGATRON_CONSTANTS.items():
            if name in chosen:
                aliases.add_argument(flag, dest=name, action="store_const", const=value,
                                     help=f"as {RUN_OPTIONS[name].flag} {'' if value is True else value}".strip())
        for flag, reason in MEGATRON_IGNORED.items():
            aliases.add_argument(flag, dest="ignored_" + flag[2:].replace("-", "_"), metavar="PATH",
                                 help=f"accepted and not used: {reason}")


def _in_brackets(option: Option) -> str:
    """The help's ending: the default, and the range of a number or a format (choices show
    in the metavar), e.g. ` (default: 20; an integer from 1 to 1000000)`."""
    notes = [f"default: {option.default_text}"] if option.default_text else []
    if option.type in (int, float) or option.valid is not None:
        notes.append(option.accepted)
    return f" ({'; '.join(notes)})" if notes else ""


def refuse_unsupported_megatron_flags(argv: Iterable[str]) -> None:
    """A Megatron flag hwbench does not take is named with what to use instead (argparse
    would only say "unrecognized arguments")."""
    for item in argv:
        flag = item.split("=", 1)[0]
        if flag in MEGATRON_INSTEAD:
            raise UsageError(f"{flag} is Megatron-LM's, and hwbench does not take it: {MEGATRON_INSTEAD[flag]}")


def options_from_namespace(args: argparse.Namespace) -> RunOptions:
    """The run options a parser made by add_run_options parsed (those it has)."""
    return RunOptions(**{name: getattr(args, name, None) for name in RUN_OPTIONS})


EXAMPLES = ("Examples on a CPU: `hwbench run` (the small model, about a minute); `hwbench run --model tiny "
            "--nproc-per-node 2 --tp 2`. Accelerator-sized (a GPU or NPU; hours to days on a CPU, which emulates the "
            "published fp16 unless it has fp16 units: the run says so before it starts): `hwbench run --device cuda "
            "--model 345m --precision bf16`; `hwbench run --model 1.3b --nproc-per-node 8`. `hwbench calibrate` "
            "once, and every run prints its estimated duration before it starts.")


def configure(parser: argparse.ArgumentParser) -> None:
    add_run_options(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.epilog = EXAMPLES


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    refuse_unsupported_megatron_flags(argv)
    return parser.parse_args(list(argv))


def run_option_flags() -> tuple[str, ...]:
    """The long options `hwbench run` takes, for a command that hands it those it does not take."""
    from hwbench.cli import Parser, command_parser

    parser = command_parser("run")[1]
    return tuple(parser.known_options()) if isinstance(parser, Parser) else ()


def parse_run_options(run_argv: Sequence[str], outer: argparse.ArgumentParser | None = None) -> RunOptions:
    """The options of `hwbench run RUN_ARGV...` (UsageError, as the command, for an unknown one).
    ``outer``: the command that passed on the arguments it does not take itself (`hwbench slurm`,
    `hwbench k8s`); an unknown one is then reported as its, with its options among the suggestions."""
    from hwbench.cli import Parser, command_parser

    _, parser = command_parser("run")
    if isinstance(outer, Parser) and isinstance(parser, Parser):
        parser.prog, parser.also_known = outer.prog, tuple(outer.known_options())
    return options_from_namespace(parse(parser, run_argv))


def parse_run_spec(run_argv: Sequence[str], check_paths: bool = True):
    """The RunSpec that `hwbench run RUN_ARGV...` would run (UsageError when it would
    refuse them). ``check_paths=False`` for a run on another machine (a pod)."""
    from hwbench.catalog import load_catalog
    from hwbench.spec import build_run_spec

    return build_run_spec(parse_run_options(run_argv), load_catalog(), check_paths=check_paths)


def main(args: argparse.Namespace) -> int:
    from hwbench.cli import note
    from hwbench.commands.preflight import print_findings
    from hwbench.harness.estimate import before_run
    from hwbench.harness.run import run_and_store

    options = options_from_namespace(args)
    for line in before_run(options, estimate=not args.quiet):  # a slow precision, how long it will take: first
        note(f"hwbench: {line}")
    outcome = run_and_store(options, show_progress=not args.quiet, on_preflight=print_findings)
    result, stored = outcome.result, outcome.stored
    for remark in outcome.notes:
        note(f"hwbench: note: {remark}")
    if result is None or stored is None:  # another rank or node stores the result
        return 0
    from hwbench.report.summary import run_summary_table

    print(stored.text if stored.path is None else run_summary_table(result, str(stored.path)))
    if stored.problem:
        print(f"hwbench: error: {stored.problem}", file=sys.stderr)
        return 1
    return 0 if result.status == "ok" else 1
