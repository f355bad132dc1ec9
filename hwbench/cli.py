"""The `hwbench` command: a dispatch table over hwbench/commands/.

Each subcommand lives in its own module under hwbench/commands/ with configure(parser) and
main(args) -> exit status; its line in `hwbench --help` is its entry in COMMANDS below.
Only the module of the command given is imported, and commands import the heavy
parts of hwbench (torch among them) inside main(), so `hwbench --help`, `hwbench
models` and `hwbench plan` start without them.

Exit status: 0 success; 1 the run finished with a status other than ok (the
result file says why); 2 bad input or a machine that lacks the device, with one
line on stderr and nothing written; 3, 4 and 5 `hwbench compare`'s regression (`hwbench accept`'s FAIL),
missing points and failed repeats (`hwbench export`'s failed runs); 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
from collections.abc import Sequence

from hwbench import __version__
from hwbench.errors import RankFailure, SetupError, Terminated, UsageError

# name -> its line in `hwbench --help`; the module is hwbench.commands.<name>.
COMMANDS = {
    "run": "train one workload on one device (or N ranks) and measure it",
    "sweep": "run every point of a suite, each in its own process tree; resumable",
    "tune": "measure layouts of a model on N devices and rank the fastest that fit",
    "plan": "predict each rank's peak memory for the layouts of a model",
    "report": "tables, plots and one HTML page from result files, beside the published tables",
    "compare": "compare two sets of results; exit 3 on a significant regression, 5 when repeats failed",
    "accept": "acceptance of a delivered system: each device against its peers, a suite against a baseline; "
              "exit 3 on FAIL",
    "baseline": "baselines from ok runs only: `save RESULTS --out FILE` for `hwbench accept`, `copy RESULTS --out "
                "DIR` for `hwbench compare`",
    "history": "keep every result in a database; change points per series, exit 3 on an open regression",
    "parity": "compare the loss curves of two runs; exit 1 when they diverge",
    "collectives": "all-reduce, all-gather, ... between the ranks of this node, as nccl-tests reports them",
    "calibrate": "measure the GEMM rate and copy bandwidth this device reaches; runs then report MFU against it",
    "system": "an MLPerf-style system description of the machine a result ran on",
    "preflight": "check the machine before measuring: other processes, clocks, governor, swap, quota, ...; "
                 "exit 1 on a failure",
    "archive": "pack results, logs, the report and a SHA-256 manifest into one .tar.gz; --verify checks one",
    "export": "results as MLPerf logs, CI benchmark JSON, Prometheus text, TensorBoard scalars, Parquet or CSV",
    "data": "prepare datasets: `hwbench data prepare --help`",
    "k8s": "print a Kubeflow PyTorchJob (or TrainJob) manifest that runs `hwbench run` on every pod",
    "slurm": "print the sbatch script that runs `hwbench run` on the nodes of a Slurm job",
    "models": "list the workloads with their parameter counts and published settings",
    "devices": "list the hardware catalog and the device this machine would use",
}


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad option as one line (no usage dump), exit 2, and names the
    options nearest to one it does not know."""

    # Options this parser hands on or was handed (`hwbench slurm` and `hwbench k8s` pass what they
    # do not take to the run options' parser): known here too, and suggested for a mistyped one.
    also_known: tuple[str, ...] = ()
    given: list[str] = []  # the arguments parsed last, for an error that argparse gives without them

    def parse_known_args(self, args=None, namespace=None):
        self.given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{did_you_mean(extras, self.known_options())}")
        return parsed

    def known_options(self) -> list[str]:
        """Every long option this parser and its subcommands' parsers take."""
        known = list(self.also_known)
        for action in self._actions:
            known += [name for name in action.option_strings if name.startswith("--")]
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    known += sub.known_options() if isinstance(sub, Parser) else []
        return sorted(set(known))

    def error(self, message: str) -> None:  # type: ignore[override]
        missing = re.fullmatch(r"argument (\S+): expected one argument", message)
        if missing:
            # argparse takes a value that starts with '-' ("--outlier -5%") for the next option.
            option = next(name for name in missing.group(1).split("/") + ["--OPTION"] if name.startswith("--"))
            message += f" (a value that starts with '-' is written {option}=VALUE)"
        if message.startswith("the following arguments are required"):  # said before any unknown option
            known = self.known_options()  # did_you_mean reads none after '--'
            message += did_you_mean([item for item in self.given if item.split("=", 1)[0] not in known], known)
        raise UsageError(f"{self.prog}: {message}" if self.prog != "hwbench" else message)


def nearest_options(given: str, known: Sequence[str]) -> list[str]:
    """The options ``given`` (a mistyped --flag or --flag=value) may have meant: those it begins
    (a shortening: commands take no abbreviations), else those spelled nearly as it is."""
    import difflib

    flag = given.split("=", 1)[0]
    longer = [name for name in known if name.startswith(flag) and name != flag]
    if 0 < len(longer) <= 4:
        return longer
    # Scored without the dashes every option shares; the near ones only (0.6: "mdoel" and
    # "model" score 0.8, "xyzzy" and "zero" 0.22), and only those about as near as the best.
    scores = {name: difflib.SequenceMatcher(None, flag.lstrip("-"), name.lstrip("-")).ratio() for name in known}
    best = max(scores.values(), default=0.0)
    return sorted((name for name, score in scores.items() if score >= max(0.6, best - 0.1)),
                  key=lambda name: -scores[name])[:3]


def did_you_mean(extras: Sequence[str], known: Sequence[str]) -> str:
    """' (did you mean --threads-per-rank?)' for argparse's unrecognized arguments; '' when
    none is near an option."""
    options = list(extras)[:list(extras).index("--")] if "--" in extras else extras  # after '--': no options
    hints = {flag: nearest for flag in dict.fromkeys(item.split("=", 1)[0] for item in options if item.startswith("--"))
             if (nearest := nearest_options(flag, known))}
    if not hints:
        return ""
    text = [" or ".join(nearest) + ("" if len(hints) == 1 else f" for {flag}") for flag, nearest in hints.items()]
    return f" (did you mean {', '.join(text)}?)"


def one_line(text: str) -> str:
    """An error message as one line: a control character a value brought in (a newline
    in an unrecognized argument) is written as its escape, as repr() writes it."""
    return "".join(repr(char)[1:-1] if not char.isprintable() and char != " " else char for char in text)


def note(line: str) -> None:
    """An informational line on stderr before or during a run (an estimate, the preflight's
    findings). A stderr that cannot be written (a log on a full disk, a closed pipe) loses the
    line, not the run: the measurement after it still reaches its result file."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _top_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="hwbench",
        description="Benchmark GPT training across NVIDIA and AMD GPUs, Ascend NPUs, Intel Gaudi and CPUs.",
        epilog="`hwbench COMMAND --help` for each command's options.",
    )
    parser.add_argument("--version", action="version", version=f"hwbench {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, summary in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    return parser


def command_parser(name: str):
    """(the command's module, its configured parser)."""
    module = importlib.import_module(f"hwbench.commands.{name}")
    parser = Parser(
        prog=f"hwbench {name}", description=getattr(module, "DESCRIPTION", COMMANDS[name]), allow_abbrev=False
    )
    module.configure(parser)
    return module, parser


def run_command(name: str, argv: Sequence[str]) -> int:
    """One command on its arguments; UsageError, SetupError and the rest propagate
    (main() turns them into one line and an exit status)."""
    module, parser = command_parser(name)
    return module.main(module.parse(parser, argv) if hasattr(module, "parse") else parser.parse_args(list(argv)))


def main(argv: Sequence[str] | None = None) -> int:
    from hwbench.lifeline import hold, raise_terminated

    hold()  # started by another hwbench process (a sweep, torchrun's agent): die with it
    if not _is_rank_of_a_job():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, raise_terminated)
    raw = list(sys.argv[1:] if argv is None else argv)
    try:
        if not raw or raw[0] not in COMMANDS:
            _top_parser().parse_args(raw)  # --help, --version, or one line naming the unknown command
            return 2
        return run_command(raw[0], raw[1:])
    except (UsageError, SetupError) as error:
        print(f"hwbench: error: {one_line(str(error))}", file=sys.stderr)
        return 2
    except RankFailure as error:  # this rank's traceback is in torchrun's error file and the rank's log
        print(f"hwbench: rank {os.environ.get('RANK', '?')}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupt:
        how = f" by {interrupt.args[0]}" if isinstance(interrupt, Terminated) and interrupt.args else ""
        print(f"hwbench: interrupted{how}; nothing unfinished was written", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # a pipe of something else broke: a real failure
        # `hwbench models | head`: the reader is gone, so is the rest of the output
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 128 + 13  # as a process killed by SIGPIPE


def _is_rank_of_a_job() -> bool:
    """A rank that torchrun or a multi-task srun started: it must die by the signal its
    launcher sends, so that the launcher records the signal and ends the job."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return True
    tasks = os.environ.get("SLURM_NTASKS", "1")
    return "SLURM_PROCID" in os.environ and tasks.isdigit() and int(tasks) > 1


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports POLLERR)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or no real stdout
        return False


if __name__ == "__main__":
    raise SystemExit(main())
