"""The run spec is one declaration: RunSpec (hwbench/spec.py). The result's spec section
(hwbench.result.model.Spec) holds the same fields, each optional because a result's spec may be
partial, and gradient accumulation is computed in one place that both read."""

from __future__ import annotations

import pytest

from hwbench.catalog import load_catalog
from hwbench.options import RunOptions
from hwbench.result.model import Spec
from hwbench.spec import build_run_spec


@pytest.mark.parametrize("options", [{"model": "small", "nproc_per_node": 2, "micro_batch_size": 2},
                                     {"model": "tiny", "nproc_per_node": 3}, {"model": "tiny"}])
def test_the_results_spec_accumulates_as_the_run_did(options):
    spec = build_run_spec(RunOptions(**options), load_catalog(), check_paths=False)
    held = Spec.model_validate(spec.to_dict())
    assert held.gradient_accumulation_steps == spec.gradient_accumulation_steps
    assert spec.gradient_accumulation_steps * spec.micro_batch_size * spec.parallel.dp == spec.global_batch_size


def test_a_partial_spec_has_no_accumulation():
    assert Spec.model_validate({"run_args": ["--model", "tiny"]}).gradient_accumulation_steps is None

