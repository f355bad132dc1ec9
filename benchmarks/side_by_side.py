"""hwbench against the bare loop on the same point, and hwbench with telemetry against
without, in one call: what hwbench's harness and its telemetry cost.

    python benchmarks/side_by_side.py --device cuda --model 345m --precision bf16 --out OUT
    python benchmarks/side_by_side.py --device cpu --model tiny --steps 2 --warmup 1 --out OUT  # mechanics

Three processes, one after another, each on its own (as hwbench runs every point), and
again for every --repeats (N = 1, 2, ...):
  1. benchmarks/bare_loop.py              -> OUT/rN/bare.json
  2. hwbench run ... --no-telemetry       -> OUT/rN/hwbench-no-telemetry/<run>.json
  3. hwbench run ... (telemetry on)       -> OUT/rN/hwbench/<run>.json
with the same model, batch, sequence, precision, recompute, compile, settings, cross-entropy,
fused QKV, steps and warm-up
(--data synthetic, --eval-iters 0: no validation inside or after the timed steps). It
writes OUT/side_by_side.json, each repeat's figures and, over the repeats, the median and
range of:
  harness_ratio               hwbench's median step (telemetry on, as a user runs it) / the bare loop's
  harness_ratio_no_telemetry  the same with --no-telemetry
  telemetry_ratio             hwbench's median step with telemetry / without
and prints them last. Every figure of every side comes from one statistic, the median step
time (tokens/s and TFLOP/s included: a result's own `tokens_per_s` is over the mean step, the
bare loop's over the median), so the columns compare like with like. Exit 0 when all three ran,
1 when one failed (the file says which), 2 on bad input.

Each repeat's figures are kept in OUT/rN/sides.json as it ends, and side_by_side.json is written
again after every repeat (`repeats_done`), so a run stopped part of the way (a device call's time
limit) leaves what it finished. With --resume a repeat whose sides.json holds every side, for the
same options on the same host, is kept and not run again: the next call only runs what is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for folder in (REPO, REPO / "benchmarks"):  # hwbench, and bare_loop.py beside this file
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from bare_loop import resolve_spec, torch_device  # noqa: E402  (beside this file)

from hwbench.cli import Parser  # noqa: E402  (argparse with one-line errors)
from hwbench.errors import UsageError  # noqa: E402
from hwbench.result.store import ResultFormatError, load_result  # noqa: E402

# The options both sides take, with the same spelling (bare_loop.py mirrors hwbench run's names).
STATISTIC = "median step time"  # what every column of both sides is computed from
SHARED = (("--model", str), ("--micro-batch-size", int), ("--global-batch-size", int), ("--seq-length", int),
          ("--max-positions", int), ("--precision", str), ("--steps", int), ("--warmup", int), ("--seed", int),
          ("--settings", str), ("--device-memory", str), ("--cross-entropy", str))
SWITCHES = ("--recompute", "--compile", "--fused-qkv")  # given as --x or --no-x, or left out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(prog="side_by_side", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="cpu, cuda, npu or auto (default: auto)")
    for flag, kind in SHARED:
        parser.add_argument(flag, type=kind)
    for flag in SWITCHES:
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--repeats", type=int, default=1, help="times the three run, one after another, in "
                        "the same order (default: 1); the ratios are each repeat's, and their median")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for each side (default: 600)")
    parser.add_argument("--out", required=True, help="folder for the three results and side_by_side.json")
    parser.add_argument("--resume", action="store_true", help="keep each repeat of an earlier call whose three "
                        "sides all ran with the same options on this host (OUT/rN/sides.json); run only the others")
    return parser.parse_args(argv)


def shared_argv(args: argparse.Namespace) -> list[str]:
    argv: list[str] = []
    for flag, _ in SHARED:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            argv += [flag, str(value)]
    for flag in SWITCHES:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            argv.append(flag if value else "--no-" + flag[2:])
    return argv


def run_child(name: str, command: list[str], timeout: float) -> dict:
    """Run one side; what it printed goes to our output as it comes (the device tool returns the tail)."""
    print(f"== {name}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1"}
    try:
        code = subprocess.run(command, cwd=REPO, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        code = None
    seconds = time.monotonic() - started
    print(f"== {name}: exit {code if code is not None else 'timeout'} after {seconds:.0f} s", flush=True)
    return {"exit": code, "wall_s": round(seconds, 1)}


def at_median(child: dict, median: float | None, tokens_per_step: float, flops_per_step: float | None,
              world: int) -> dict:
    """A side's figures from its median step time: tokens/s and TFLOP/s per device included."""
    known = bool(median) and median > 0
    return {**child, "step_time_median_s": median,
            "tokens_per_s": tokens_per_step / median if known else None,
            "tflops_per_device": flops_per_step / median / world / 1e12 if known and flops_per_step else None}


def hwbench_side(folder: Path, child: dict) -> dict:
    """The figures of the one result `hwbench run` wrote into ``folder``."""
    files = sorted(folder.glob("*.json"))
    if len(files) != 1:
        return {**child, "error": f"{len(files)} result files in {folder}"}
    try:
        result = load_result(files[0])
    except ResultFormatError as error:
        return {**child, "error": str(error)}
    metrics, spec = result.metrics, result.spec
    median = metrics.step_time_s.median if metrics.step_time_s else None
    tokens = (spec.global_batch_size or 0) * (spec.seq_length or 0)
    figures = {**at_median(child, median, tokens, metrics.flops_per_iteration, metrics.world_size or 1),
               "result": str(files[0]), "status": result.status,
               "peak_memory_bytes": metrics.memory.peak_reserved_bytes if metrics.memory else None}
    if result.status != "ok":
        figures["error"] = (result.error.message if result.error else None) or f"status {result.status}"
    return figures


def bare_side(path: Path, child: dict) -> dict:
    if not path.is_file():
        return {**child, "error": f"no {path.name}"}
    figures = json.loads(path.read_text())
    tokens = figures["global_batch_size"] * figures["seq_length"]
    return {**at_median(child, figures["step_time_s"]["median"], tokens, figures["flops_per_iteration"], 1),
            "result": str(path), "status": "ok", "peak_memory_bytes": figures["peak_memory_bytes"]}


def ratio(numerator: dict, denominator: dict) -> float | None:
    a, b = numerator.get("step_time_median_s"), denominator.get("step_time_median_s")
    if "error" in numerator or "error" in denominator or not a or not b:
        return None
    return a / b


def table(sides: dict[str, dict], ratios: dict[str, float | None]) -> str:
    def cell(value, scale=1.0, digits=1):
        return "-" if value is None else f"{value * scale:,.{digits}f}"

    lines = [f"every column from each side's {STATISTIC}",
             f"{'side':<22}{'median step ms':>16}{'tokens/s':>14}{'TFLOP/s':>10}{'peak GiB':>10}  status"]
    for name, side in sides.items():
        lines.append(f"{name:<22}{cell(side.get('step_time_median_s'), 1000):>16}"
                     f"{cell(side.get('tokens_per_s'), 1, 0):>14}{cell(side.get('tflops_per_device')):>10}"
                     f"{cell(side.get('peak_memory_bytes'), 2**-30, 2):>10}  "
                     f"{side.get('error') or side.get('status', '?')}")
    lines += [f"{name} = {'-' if value is None else f'{value:.3f}'}" for name, value in ratios.items()]
    return "\n".join(lines)


RATIOS = {  # name: (numerator side, denominator side, definition)
    "harness_ratio": ("hwbench", "bare loop", "hwbench median step (telemetry on) / bare loop median step"),
    "harness_ratio_no_telemetry": ("hwbench --no-telemetry", "bare loop",
                                   "hwbench --no-telemetry median step / bare loop median step"),
    "telemetry_ratio": ("hwbench", "hwbench --no-telemetry", "hwbench median step with telemetry / without"),
}


def combine(repeats: list[dict[str, dict]]) -> dict:
    """Each repeat's ratios, and over the repeats their median and range (None where a
    repeat lacks a side). One repeat's sides ran back to back, so its ratios are the least
    disturbed by a card's clocks or temperature drifting between repeats."""
    document: dict = {"statistic": STATISTIC, "repeats": [],
                      "definitions": {name: text for name, (_, _, text) in RATIOS.items()}}
    for sides in repeats:
        document["repeats"].append({"sides": sides, **{name: ratio(sides[a], sides[b])
                                                        for name, (a, b, _) in RATIOS.items()}})
    for name in RATIOS:
        values = [r[name] for r in document["repeats"]]
        known = sorted(v for v in values if v is not None)
        whole = len(known) == len(values) and known
        document[name] = statistics.median(known) if whole else None
        document[name + "_range"] = [known[0], known[-1]] if whole else None
    return document


def kept_repeat(out: Path, options: dict) -> dict[str, dict] | None:
    """A repeat an earlier call finished: its sides, when every side ran with these options."""
    try:
        kept = json.loads((out / "sides.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("options") != options:
        return None
    sides = kept.get("sides")
    if not isinstance(sides, dict) or set(sides) != {"bare loop", *HWBENCH_SIDES}:
        return None
    return sides if all(isinstance(side, dict) and "error" not in side for side in sides.values()) else None


HWBENCH_SIDES = {"hwbench --no-telemetry": ("hwbench-no-telemetry", ["--no-telemetry"]), "hwbench": ("hwbench", [])}


def run_repeat(args: argparse.Namespace, shared: list[str], out: Path) -> dict[str, dict] | None:
    """One bare loop and two hwbench runs into ``out``; None on bad input."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "sides.json").unlink(missing_ok=True)  # written again once all three have run
    bare_json = out / "bare.json"
    bare_json.unlink(missing_ok=True)
    bare = run_child("bare loop", [sys.executable, str(REPO / "benchmarks" / "bare_loop.py"), "--device", args.device,
                                   *shared, "--json", str(bare_json)], args.timeout)
    if bare["exit"] == 2:
        return None  # bad input: bare_loop.py said which, in one line, as hwbench run would have
    sides = {"bare loop": bare_side(bare_json, bare)}
    for name, (folder, extra) in HWBENCH_SIDES.items():
        target = out / folder
        target.mkdir(exist_ok=True)
        for old in target.glob("*.json"):  # one result per side: a rerun replaces it
            old.unlink()
        child = run_child(name, [sys.executable, "-m", "hwbench", "run", "--quiet", "--device", args.device, *shared,
                                 "--data", "synthetic", "--eval-iters", "0", "--timeout", str(args.timeout),
                                 *extra, "--out", str(target)], args.timeout + 60)
        sides[name] = hwbench_side(target, child)
    return sides


def write_atomically(path: Path, document: dict) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(document, indent=2) + "\n")
    part.replace(path)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        if not 1 <= args.repeats <= 100:
            raise UsageError(f"side_by_side: --repeats {args.repeats} is not accepted; give an integer from 1 to 100")
        if not 1 <= args.timeout <= 86400:  # NaN fails this too
            raise UsageError(f"side_by_side: --timeout {args.timeout} is not accepted; give seconds from 1 to 86400")
        resolve_spec(args)  # the point, checked as hwbench run checks it, before any folder or process
        torch_device(args.device)
    except UsageError as error:
        print(error, file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    shared = shared_argv(args)
    # the host too: a repeat is kept only on the machine that ran it (a session folder carried to
    # another machine runs its repeats again there)
    options = {"device": args.device, "shared": shared, "host": platform.node()}
    repeats = []
    for number in range(1, args.repeats + 1):
        folder = out / f"r{number}"
        sides = kept_repeat(folder, options) if args.resume else None
        if sides is not None:
            print(f"== repeat {number}: kept {folder / 'sides.json'} (every side ran, same options)", flush=True)
        else:
            sides = run_repeat(args, shared, folder)
            if sides is None:
                return 2
            write_atomically(folder / "sides.json", {"options": options, "sides": sides})
        repeats.append(sides)
        print(table(sides, {name: ratio(sides[a], sides[b]) for name, (a, b, _) in RATIOS.items()}), flush=True)
        document = {"options": {**options, "repeats": args.repeats}, "repeats_done": number, **combine(repeats)}
        write_atomically(out / "side_by_side.json", document)  # after every repeat: a stopped call keeps them
    print(f"over {args.repeats} repeat(s), median [range]:")
    for name in RATIOS:
        value, spread = document[name], document[name + "_range"]
        print(f"{name} = " + ("-" if value is None else f"{value:.3f} [{spread[0]:.3f} to {spread[1]:.3f}]"))
    return 0 if all("error" not in side for sides in repeats for side in sides.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
