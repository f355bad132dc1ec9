"""A small history to look at: the trend page screenshots in docs/img/ come from it.

    python benchmarks/history_demo.py FOLDER
    hwbench history changes --db FOLDER/history.sqlite
    hwbench history report --db FOLDER/history.sqlite --out FOLDER/trends.html

Copies of a real result (tests/data/compare/tiny-cpu.json) as 45 nights of a nightly sweep
(3 repeats a night, 1.5% run-to-run noise) of three points: one whose throughput fell 6% at
night 30 and stayed down (an open regression: `changes` exits 3), one with a dip that was
fixed 8 nights later, and one whose torch upgrade at night 25 sped it up (a new segment).
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hwbench.result.model import RunResult  # noqa: E402
from hwbench.result.store import write_result  # noqa: E402

NIGHTS = 45
POINTS = {  # name -> (layout, level of each night, night of the torch upgrade)
    "one-rank": ({"tp": 1, "pp": 1, "dp": 1}, lambda n: 1900 * (0.94 if n >= 30 else 1.0), None),
    "tp2": ({"tp": 2, "pp": 1, "dp": 1}, lambda n: 1200 * (0.91 if 14 <= n < 22 else 1.0), None),
    "pp2": ({"tp": 1, "pp": 2, "dp": 1}, lambda n: 1500 * (1.12 if n >= 25 else 1.0), 25),
}


def main() -> None:
    folder = Path(sys.argv[1])
    template = json.loads((ROOT / "tests" / "data" / "compare" / "tiny-cpu.json").read_text())
    rng = random.Random(17)
    for night in range(NIGHTS):
        date = f"2026-{10 + night // 30:02d}-{1 + night % 30:02d}"
        commit = f"{rng.getrandbits(160):040x}"
        for name, (layout, level, upgrade) in POINTS.items():
            for repeat in range(3):
                data = copy.deepcopy(template)
                data["run_id"] = f"{date}-{name}-{repeat}"
                data["started_at"] = f"{date}T02:{17 + repeat:02d}:00.000+00:00"
                data["spec"]["parallel"].update(layout)
                data["environment"]["hwbench_git"] = {"commit": commit, "dirty": False}
                if upgrade is not None and night >= upgrade:
                    data["environment"]["torch_version"] = "2.14.0+cpu"
                value = level(night) * (1 + rng.gauss(0, 0.015))
                data["metrics"]["tokens_per_s"] = value
                data["metrics"]["step_time_s"]["median"] = 8 * data["spec"]["seq_length"] / value
                data["sweep"] = {"suite": "nightly", "suite_path": "x", "point": name, "repeat": repeat,
                                 "repeats": 3, "key": f"{name}-{repeat}"}
                write_result(RunResult.from_dict(data), folder / "results" / date / name)
    subprocess.run([sys.executable, "-m", "hwbench", "history", "add", str(folder / "results"), "--db",
                    str(folder / "history.sqlite")], check=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


if __name__ == "__main__":
    main()
