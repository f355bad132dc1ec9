"""The pytest-benchmark files beside the scripts: off unless asked for (--benchmark-enable),
and skipped with the reason where pytest-benchmark is not installed."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # runs before pytest-benchmark's own (trylast) configure, which reads the option
    if config.pluginmanager.hasplugin("benchmark"):
        config.option.benchmark_disable = True  # --benchmark-enable still wins


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.pluginmanager.hasplugin("benchmark"):
        return
    skip = pytest.mark.skip(reason="pytest-benchmark is not installed (pip install -e '.[test]')")
    for item in items:
        if "benchmark" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)
