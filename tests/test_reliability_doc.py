"""docs/reliability.md names the test that holds each promise: every one it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_every_test_named_in_the_reliability_page_exists():
    page = (ROOT / "docs" / "reliability.md").read_text()
    named = set(re.findall(r"`(test_\w+)`", page))
    files = set(re.findall(r"`(tests/test_\w+\.py)`", page))
    defined = {name for path in (ROOT / "tests").glob("test_*.py")
               for name in re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE)}
    assert len(named) > 50  # the page names its tests: an empty match would pass anything
    assert sorted(named - defined) == []
    assert sorted(path for path in files if not (ROOT / path).exists()) == []
