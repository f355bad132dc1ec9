"""The `hwbench` command: parses, calls, prints. No logic of its own.

Exit status: 0 success; 1 the run finished with a status other than ok (the
result file says why); 2 bad input or a machine that lacks the device, with
one line on stderr and nothing written; 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from tabulate import tabulate

from hwbench import __version__
from hwbench.catalog import PRECISIONS, load_catalog
from hwbench.device import DEVICE_CHOICES
from hwbench.errors import RankFailure, SetupError, UsageError
from hwbench.spec import DEFAULT_MODEL, DEFAULT_OUT, DEFAULT_STEPS, DEFAULT_WARMUP, ENGINES, PP_SCHEDULES
from hwbench.workload.flops import FLOPS_FORMULAS


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad option as one line (no usage dump), exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hwbench", description="Benchmark GPT training across NVIDIA GPUs, Ascend NPUs and CPUs.")
    parser.add_argument("--version", action="version", version=f"hwbench {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="train one workload on one device and measure it")
    run.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                     help="auto picks npu, then cuda, then cpu (default: auto)")
    run.add_argument("--model", help=f"workload from the catalog, see `hwbench models` (default: {DEFAULT_MODEL})")
    run.add_argument("--micro-batch-size", type=int, help="samples per forward pass (default: the workload's)")
    run.add_argument("--global-batch-size", type=int,
                     help="samples per optimizer step; a multiple of the micro batch (default: the workload's)")
    run.add_argument("--seq-length", type=int, help="tokens per sample (default: the workload's)")
    run.add_argument("--precision", choices=PRECISIONS, help="fp32, or bf16/fp16 autocast (default: the workload's)")
    run.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=None,
                     help="activation checkpointing of every block (default: the workload's)")
    run.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    run.add_argument("--data", help="builtin (a synthetic language with a known entropy), synthetic (i.i.d. Zipf "
                     "tokens) or the prefix of a Megatron dataset PREFIX.bin/.idx (default: builtin)")
    run.add_argument("--split", help="train,valid,test weights for --data PREFIX (default: 949,50,1)")
    run.add_argument("--eval-interval", type=int, help="validate every N steps; 0: only after the last (default: 0)")
    run.add_argument("--eval-iters", type=int, help="global batches per validation; 0: none (default: 10)")
    run.add_argument("--steps", type=int, help=f"timed optimizer steps (default: {DEFAULT_STEPS})")
    run.add_argument("--warmup", type=int, help=f"untimed steps before them (default: {DEFAULT_WARMUP})")
    run.add_argument("--seed", type=int, help="seed for weights and data (default: the workload's)")
    run.add_argument("--out", help=f"folder for the result file (default: {DEFAULT_OUT})")
    run.add_argument("--telemetry", action=argparse.BooleanOptionalAction, default=None,
                     help="sample power, clocks and temperature during the timed steps (default: on)")
    run.add_argument("--telemetry-interval", type=float, help="seconds between telemetry samples (default: 0.5)")
    run.add_argument("--flops-formula", choices=tuple(FLOPS_FORMULAS),
                     help="model FLOPs formula for TFLOP/s and MFU (default: megatron-lm)")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    layout = run.add_argument_group("parallel layout")
    layout.add_argument("--tp", type=int, help="tensor-parallel degree (default: the workload's published layout "
                        "when the world size allows, else 1)")
    layout.add_argument("--pp", type=int, help="pipeline-parallel stages (default: as --tp)")
    layout.add_argument("--dp", type=int, help="data-parallel degree (default: world size / (tp x pp))")
    layout.add_argument("--fsdp", action="store_true", default=None,
                        help="shard parameters, gradients and optimizer state over dp with FSDP2 (native engine)")
    layout.add_argument("--zero", type=int, help="DeepSpeed ZeRO stage 0-3 (--engine deepspeed; default: 0)")
    layout.add_argument("--engine", choices=ENGINES, help="native (torch.distributed) or deepspeed (default: native)")
    layout.add_argument("--pp-schedule", choices=PP_SCHEDULES,
                        help="pipeline schedule (default: 1f1b, or gpipe when there are fewer microbatches than stages)")
    launch = run.add_argument_group("processes and nodes (torchrun)")
    launch.add_argument("--nproc-per-node", type=int, help="ranks on this node (default: 1, in this process)")
    launch.add_argument("--nnodes", type=int, help="nodes in the job (default: 1)")
    launch.add_argument("--node-rank", type=int, help="this node's rank, 0 to nnodes-1 (default: 0)")
    launch.add_argument("--master-addr", help="address of node 0 (default: 127.0.0.1)")
    launch.add_argument("--master-port", type=int, help="port on node 0 (default: a free one on one node; 29500 "
                        "across nodes)")
    launch.add_argument("--rdzv-endpoint", help="HOST:PORT of a c10d rendezvous, instead of --master-addr/--master-port")
    launch.add_argument("--timeout", type=float, help="seconds before a run that has not finished is ended, every "
                        "process with it (default: 1800)")

    parity = commands.add_parser("parity", help="compare the loss curves of two runs; exit 1 when they diverge")
    parity.add_argument("run_a", metavar="RUN_A", help="result file")
    parity.add_argument("run_b", metavar="RUN_B", help="result file")
    parity.add_argument("--tolerance", type=float, default=None,
                        help="largest relative loss difference allowed at any step (default: 0.02)")

    data = commands.add_parser("data", help="prepare datasets: `hwbench data prepare --help`")
    data.add_argument("data_command", choices=("prepare",))
    data.add_argument("data_args", nargs=argparse.REMAINDER)

    sweep = commands.add_parser("sweep", help="run every point of a suite, each in its own process tree; resumable")
    sweep.add_argument("suite", metavar="SUITE", help="a suite file, or a shipped suite: smoke, nightly, table2, table3")
    sweep.add_argument("--device", choices=DEVICE_CHOICES, help="for every point that does not set its own")
    sweep.add_argument("--nproc-per-node", type=int, help="for every point that does not set its own")
    sweep.add_argument("--repeats", type=int, default=1, help="runs of each point, with seeds seed, seed+1, ... "
                       "(default: 1)")
    sweep.add_argument("--out", default=DEFAULT_OUT, help=f"results go to OUT/<suite>/<point>/ (default: {DEFAULT_OUT})")
    sweep.add_argument("--force", action="store_true", help="run points again whose results already exist")
    sweep.add_argument("--no-plan", dest="plan", action="store_false",
                       help="run points the memory planner predicts will not fit")
    sweep.add_argument("--wait", action="store_true",
                       help="when another sweep is writing the same suite folder, wait for it instead of refusing")
    sweep.add_argument("--quiet", action="store_true", help="no line per point")

    tune = commands.add_parser("tune", help="measure layouts of a model on N devices and rank the fastest that fit")
    tune.add_argument("--model", required=True, help="workload from the catalog")
    tune.add_argument("--devices", type=int, required=True, help="devices (ranks) on this node")
    tune.add_argument("--device", choices=DEVICE_CHOICES, default="auto", help="device kind (default: auto)")
    tune.add_argument("--device-memory", help="capacity per device for the planner, e.g. 32GiB (default: the "
                      "device's own, or the catalog's)")
    tune.add_argument("--engines", default="native", help="native, deepspeed or native,deepspeed (default: native)")
    tune.add_argument("--max-trials", type=int, default=8, help="layouts to measure at most (default: 8)")
    tune.add_argument("--patience", type=int, default=3,
                      help="stop after this many trials in a row without a 2%% gain (default: 3)")
    tune.add_argument("--steps", type=int, default=10, help="timed steps per trial (default: 10)")
    tune.add_argument("--warmup", type=int, default=3, help="warm-up steps per trial (default: 3)")
    for option in ("--precision", "--seq-length", "--global-batch-size", "--data"):
        tune.add_argument(option, help="as for `hwbench run`")
    tune.add_argument("--timeout", type=float, default=600, help="seconds per trial (default: 600)")
    tune.add_argument("--out", default="results/tune", help="trials go to OUT/<candidate>/ (default: results/tune)")
    tune.add_argument("--quiet", action="store_true", help="no line per trial")

    commands.add_parser("report", add_help=False,
                        help="tables, plots and one HTML page from result files, beside the published tables "
                             "(`hwbench report --help`)")
    commands.add_parser("compare", add_help=False,
                        help="compare two sets of results; exit 3 on a significant regression (`hwbench compare --help`)")
    commands.add_parser("system", add_help=False,
                        help="an MLPerf-style system description of the machine a result ran on")
    commands.add_parser("plan", add_help=False,
                        help="predict each rank's peak memory for the layouts of a model (`hwbench plan --help`)")
    commands.add_parser("k8s", add_help=False,
                        help="print a Kubeflow PyTorchJob manifest that runs `hwbench run` on every pod "
                             "(`hwbench k8s --help`)")
    commands.add_parser("models", help="list the workloads with their parameter counts and published settings")
    commands.add_parser("devices", help="list the hardware catalog and the device this machine would use")
    return parser


def _run_options(args: argparse.Namespace) -> dict:
    options = vars(args).copy()
    options["telemetry_interval"] = options.pop("telemetry_interval")
    return options


def run_option_names() -> frozenset[str]:
    """The option names (argparse dests) `hwbench run` takes: what a suite point may set."""
    run = _build_parser()._subparsers._group_actions[0].choices["run"]
    return frozenset(action.dest for action in run._actions if action.dest != "help")


def parse_run_spec(run_argv: Sequence[str], check_paths: bool = True):
    """The RunSpec that `hwbench run RUN_ARGV...` would run, validated the same
    way (raises UsageError). ``check_paths=False`` for a run that happens on
    another machine (hwbench.k8s), where --data and --out are that machine's paths."""
    from hwbench.spec import build_run_spec

    args = _build_parser().parse_args(["run", *run_argv])
    return build_run_spec(_run_options(args), load_catalog(), check_paths=check_paths)


def _cmd_run(args: argparse.Namespace, run_argv: list[str]) -> int:
    """One point: in this process (one rank), as this rank of a torchrun job
    (when torchrun started this command), or as a torchrun job this command
    launches (--nproc-per-node / --nnodes)."""
    from hwbench.engine.distributed import RankEnvironment
    from hwbench.report.summary import run_summary_table
    from hwbench.harness.faults import Fault
    from hwbench.results import store_result
    from hwbench.spec import build_run_spec

    catalog = load_catalog()
    rank_env = RankEnvironment.from_environ()
    spec = build_run_spec(_run_options(args), catalog,
                          torchrun_world_size=rank_env.world_size if rank_env else None)
    Fault.from_environ(spec.launch.world_size, spec.warmup + spec.steps)  # a drill it can never meet: refused
    if rank_env is not None:
        from hwbench.harness.worker import run_as_rank

        return run_as_rank(spec, catalog, rank_env, show_progress=not args.quiet)
    if spec.launch.world_size > 1 or spec.launch.nnodes > 1:
        from hwbench.harness.launcher import launch, recover_stranded_runs

        for note in recover_stranded_runs():
            print(f"hwbench: note: {note}", file=sys.stderr)
        result = launch(spec, run_argv, catalog)
        if result is None:
            print(f"node {spec.launch.node_rank}: its ranks finished; node 0 writes the result")
            return 0
    else:
        from hwbench.harness.worker import run_point

        result = run_point(spec, catalog, show_progress=not args.quiet)
    from hwbench.harness.sweep import SWEEP_ENV

    if os.environ.get(SWEEP_ENV):  # hwbench sweep ran this point: say which (hwbench.harness.sweep)
        import json

        result.sweep = json.loads(os.environ[SWEEP_ENV])
    stored = store_result(result, spec.out_dir)
    if stored.path is None:
        print(stored.text)
        print(f"hwbench: error: {stored.problem}", file=sys.stderr)
        return 1
    print(run_summary_table(result, str(stored.path)))
    if stored.problem:
        print(f"hwbench: error: {stored.problem}", file=sys.stderr)
        return 1
    return 0 if result.status == "ok" else 1


def _cmd_sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hwbench.harness.suite import find_suite, load_suite
    from hwbench.harness.sweep import SweepInterrupted, SweepOptions, run_sweep
    from hwbench.report.summary import sweep_summary_table

    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats} is not accepted; give an integer >= 1")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node {args.nproc_per_node} is not accepted; give an integer >= 1")
    from hwbench.harness.launcher import recover_stranded_runs
    from hwbench.results import check_output_folder

    suite = load_suite(find_suite(args.suite), run_option_names())
    check_output_folder(args.out)
    for note in recover_stranded_runs():
        print(f"hwbench: note: {note}", file=sys.stderr)
    options = SweepOptions(out_dir=Path(args.out), device=args.device, nproc_per_node=args.nproc_per_node,
                           repeats=args.repeats, force=args.force, plan=args.plan, wait=args.wait)
    try:
        records = run_sweep(suite, options, show_progress=not args.quiet)
    except SweepInterrupted as stop:
        print(f"hwbench: sweep stopped by {stop}; finished points are kept, the same command resumes",
              file=sys.stderr)
        return 128 + stop.signal_number
    print(sweep_summary_table(suite, records))
    bad = [r for r in records if any(x.status not in ("ok", "skipped") for x in r.results)]
    return 1 if bad else 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hwbench.harness.tune import ranking, tune, write_ranking
    from hwbench.results import RANKING_FILE
    from hwbench.planner import parse_size

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or any(e not in ENGINES for e in engines):
        raise UsageError(f"--engines {args.engines!r} is not accepted; give native, deepspeed or native,deepspeed")
    for option, value, minimum in (("--devices", args.devices, 1), ("--max-trials", args.max_trials, 1),
                                   ("--patience", args.patience, 1), ("--steps", args.steps, 1),
                                   ("--warmup", args.warmup, 0)):
        if value < minimum:
            raise UsageError(f"{option} {value} is not accepted; give an integer >= {minimum}")
    base = ["--model", args.model, "--device", args.device, "--steps", str(args.steps), "--warmup",
            str(args.warmup), "--eval-iters", "0", "--no-telemetry", "--timeout", str(args.timeout),
            "--data", args.data or "synthetic"]
    for option in ("precision", "seq_length", "global_batch_size"):
        if getattr(args, option) is not None:
            base += ["--" + option.replace("_", "-"), getattr(args, option)]
    from hwbench.results import check_output_folder
    from hwbench.spec import check_data

    parse_run_spec(base, check_paths=False)  # the fixed options must be valid on their own
    if args.data:
        check_data(args.data)  # before the first trial, not once per trial
    check_output_folder(args.out)
    capacity = parse_size(args.device_memory, "--device-memory") if args.device_memory else _device_capacity(args)
    out = Path(args.out)
    trials = tune(base, args.devices, out / f"{args.model}-{args.devices}", capacity, engines, args.max_trials,
                  args.patience, show_progress=not args.quiet)
    write_ranking(trials, out / f"{args.model}-{args.devices}" / RANKING_FILE)
    ranked = ranking(trials)
    rows = [[i, t.candidate.name, f"{t.samples_per_s:,.2f}", f"{t.samples_per_s / ranked[0].samples_per_s:.0%}",
             f"{t.predicted_peak_bytes / 2**30:.2f}" if t.predicted_peak_bytes else "-"]
            for i, t in enumerate(ranked, start=1)]
    print(tabulate(rows, headers=["rank", "layout", "samples/s", "of best", "predicted GiB/rank"],
                   disable_numparse=True))
    counts = {}
    for t in trials:
        if not t.samples_per_s:
            counts[t.status] = counts.get(t.status, 0) + 1
    print("not ranked: " + (", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none"))
    print(f"ranking and every trial: {out / f'{args.model}-{args.devices}' / RANKING_FILE}")
    return 0 if ranked else 1


def _device_capacity(args: argparse.Namespace) -> int | None:
    from hwbench.device import select_backend
    from hwbench.harness.worker import device_capacity_bytes

    return device_capacity_bytes(select_backend(args.device), load_catalog())


def _cmd_parity(args: argparse.Namespace) -> int:
    from hwbench.report.parity import DEFAULT_TOLERANCE, compare_runs, format_report
    from hwbench.results import ResultFormatError, load_result

    try:
        a, b = load_result(args.run_a), load_result(args.run_b)
    except ResultFormatError as error:
        raise UsageError(str(error)) from None
    report = compare_runs(a, b, DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance)
    print(format_report(report, a, b))
    return 0 if report.within_tolerance else 1


def _cmd_data(args: argparse.Namespace) -> int:
    from hwbench.workload import prepare

    return prepare.main(args.data_args)


def _cmd_models(args: argparse.Namespace) -> int:
    from hwbench.workload.params import count_parameters

    rows = []
    for workload in sorted(load_catalog().workloads.values(), key=lambda w: count_parameters(w.model).total):
        m, t, p = workload.model, workload.training, workload.published
        counts = count_parameters(m)
        rows.append([
            workload.name, f"{counts.total / 1e6:,.1f}M", f"{counts.non_embedding / 1e6:,.1f}M",
            m.num_layers, m.hidden_size, m.num_attention_heads, t.seq_length,
            f"{t.micro_batch_size}/{t.global_batch_size}", t.precision, "yes" if t.recompute else "no",
            f"{p.devices} dev, TP{p.tp} PP{p.pp} ({', '.join(p.tables)})" if p else "-",
        ])
    print(tabulate(rows, headers=["model", "params", "non-emb", "layers", "hidden", "heads", "seq",
                                  "micro/global", "precision", "recompute", "published layout"],
                   disable_numparse=True))
    print("\nParameters are counted from the architecture (padded GPT-2 vocabulary at TP1), no weights allocated.")
    return 0


def _cmd_devices(args: argparse.Namespace) -> int:
    from hwbench.device import detect_device, select_backend

    rows = []
    for entry in sorted(load_catalog().devices.values(), key=lambda d: (d.vendor, d.name)):
        peaks = ", ".join(f"{k} {v / 1e12:g}" for k, v in entry.peak_flops.items() if v) or "none known"
        memory = f"{entry.memory_bytes / 2**30:g} GiB" if entry.memory_bytes else "from device"
        rows.append([entry.name, entry.backend, entry.title, memory, peaks])
    print(tabulate(rows, headers=["entry", "backend", "model", "memory", "peak TFLOP/s (dense)"]))
    detected = detect_device()
    backend = select_backend(detected)
    names = ", ".join(backend.device_names())
    print(f"\nThis machine: --device auto uses {detected} ({backend.device_count()} x {names})")
    return 0


# Commands whose module parses its own arguments (hwbench k8s also takes `hwbench run` options);
# `run` too is dispatched in main(), since the launcher passes its raw arguments on to every rank.
OWN_PARSER_COMMANDS = {"k8s": "hwbench.k8s", "plan": "hwbench.planner", "report": "hwbench.report.report",
                       "compare": "hwbench.report.compare", "system": "hwbench.report.system"}
COMMANDS = {"sweep": _cmd_sweep, "tune": _cmd_tune, "data": _cmd_data, "parity": _cmd_parity, "models": _cmd_models, "devices": _cmd_devices}


def main(argv: Sequence[str] | None = None) -> int:
    from hwbench.harness.lifeline import hold

    hold()  # started by another hwbench process (a sweep, torchrun's agent): die with it
    raw = list(sys.argv[1:] if argv is None else argv)
    try:
        if raw[:1] and raw[0] in OWN_PARSER_COMMANDS:
            import importlib

            return importlib.import_module(OWN_PARSER_COMMANDS[raw[0]]).main(raw[1:])
        args = _build_parser().parse_args(raw)
        if args.command == "run":  # the launcher passes the same options on to every rank
            return _cmd_run(args, raw[raw.index("run") + 1:])
        return COMMANDS[args.command](args)
    except (UsageError, SetupError) as error:
        print(f"hwbench: error: {error}", file=sys.stderr)
        return 2
    except RankFailure as error:  # this rank's traceback is in torchrun's error file and the rank's log
        print(f"hwbench: rank {os.environ.get('RANK', '?')}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hwbench: interrupted; nothing unfinished was written", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # a pipe of something else broke: a real failure
        # `hwbench models | head`: the reader is gone, so is the rest of the output
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 128 + 13  # as a process killed by SIGPIPE


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
