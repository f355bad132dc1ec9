"""benchmarks/session_summary.py: the table a device session prints last marks an HFU figure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from session_summary import HEADERS, result_rows  # noqa: E402

RUN = REPO / "tests" / "data" / "report" / "good" / "a-345m-h100x2.json"  # mfu 0.25


def test_a_recompute_run_counted_by_megatron_deepspeed_reads_hfu(tmp_path):
    for name, recompute, formula in (("hw", True, "megatron-deepspeed"), ("plain", False, "megatron-deepspeed"),
                                     ("model", True, "megatron-core-v0.12")):
        (tmp_path / name).mkdir()
        data = json.loads(RUN.read_text())
        data["spec"].update(recompute=recompute, flops_formula=formula)
        data["metrics"]["flops_formula"] = formula
        (tmp_path / name / "result.json").write_text(json.dumps(data))
    mfu = HEADERS.index("MFU")
    got = {row[0].split(":")[0]: row[mfu] for row in result_rows(tmp_path)}
    assert got == {"hw": "25.0% HFU", "plain": "25.0%", "model": "25.0%"}
