"""How long `hwbench history add` takes for 10,000 results and `hwbench history changes` for
200 series of 50 nights (docs/history.md). Not part of the test run:

    python benchmarks/history_speed.py [--keep FOLDER] [--db postgresql://...]

The results are copies of a real one (tests/data/compare/tiny-cpu.json): 200 points (other
sequence lengths) x 50 nights, one run a night, throughput around a level with 2% noise and a
5% drop in every fifth series. The two commands run as a user runs them, in a child process
each, timed from outside (interpreter start included).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hwbench.result.model import RunResult  # noqa: E402
from hwbench.result.store import write_result  # noqa: E402

POINTS, NIGHTS = 200, 50


def write_results(folder: Path) -> None:
    template = json.loads((ROOT / "tests" / "data" / "compare" / "tiny-cpu.json").read_text())
    rng = random.Random(5)
    for point in range(POINTS):
        for night in range(NIGHTS):
            data = copy.deepcopy(template)
            data["run_id"] = f"p{point}-n{night}"
            data["spec"]["seq_length"] = 64 + point
            data["started_at"] = f"2026-{9 + night // 28:02d}-{1 + night % 28:02d}T02:17:00.000+00:00"
            data["environment"]["hwbench_git"] = {"commit": f"{night:07d}" + "0" * 33, "dirty": False}
            drop = 0.95 if point % 5 == 0 and night >= 40 else 1.0
            data["metrics"]["tokens_per_s"] = 1000 * drop * (1 + rng.gauss(0, 0.02))
            write_result(RunResult.from_dict(data), folder / f"n{night:02d}")


def timed(argv: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hwbench", *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start, (done.stdout.strip().splitlines() or [""])[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="write the results and the database here (default: a temporary folder)")
    parser.add_argument("--db", help="the database (default: FOLDER/history.sqlite); an empty PostgreSQL "
                                     "database's URL times that")
    args = parser.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="hwbench-history-speed-"))
    if not (folder / "results").exists():
        write_results(folder / "results")
    db = args.db or folder / "history.sqlite"
    for argv in (["history", "add", str(folder / "results"), "--db", str(db)],
                 ["history", "add", str(folder / "results"), "--db", str(db)],
                 ["history", "changes", "--db", str(db), "--metric", "tokens_per_s"],
                 ["history", "changes", "--db", str(db)],
                 ["history", "report", "--db", str(db), "--metric", "tokens_per_s", "--out", str(folder / "t.html")]):
        seconds, last = timed(argv)
        print(f"{seconds:6.2f} s  hwbench {' '.join(argv[:2])} {' '.join(a for a in argv[2:] if a.startswith('--'))}: "
              f"{last}")


if __name__ == "__main__":
    main()
