"""The trend page a new user meets (`hwbench history report`, hwbench/history/page.py): the
headline series (tokens/s) first, y ticks on round numbers of what the axis shows and no two
alike, and no two nights under the same date label. Nights as tests/test_history.py writes them
(modified copies of a real result); the page is read as the browser gets it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from test_history import history, night_date, write_nights


def _page(tmp_path: Path, capsys, runs: Path, *extra: str) -> str:
    db = tmp_path / "h.sqlite"
    assert history(capsys, "add", runs, "--db", db)[0] == 0
    assert history(capsys, "report", "--db", db, "--out", tmp_path / "trends.html", *extra)[0] == 0
    return (tmp_path / "trends.html").read_text()


def _charts(page: str) -> dict[str, str]:
    """Each series' title and its chart's SVG."""
    return dict(re.findall(r"<h2>([^<]+?)\s*<span.*?(<svg.*?</svg>)", page, re.S))


def _y_ticks(chart: str) -> list[str]:
    return re.findall(r'<text x="\d+" y="[\d.]+" font-size="11" fill="#555" text-anchor="end">([^<]*)</text>', chart)


@pytest.fixture
def charts(tmp_path, capsys) -> dict[str, str]:
    """tokens/s fell at night 12 (so step time rose): both have a change point; peak memory is flat."""
    return _charts(_page(tmp_path, capsys, write_nights(tmp_path / "runs", [1000.0] * 12 + [900.0] * 9)))


def test_the_headline_series_comes_first(charts):
    """tokens/s came after 'median step time' (in name order)."""
    assert [title.split(" of ")[0] for title in charts] == ["tokens/s", "median step time", "peak memory"]


def test_y_ticks_are_round_even_and_distinct(charts):
    """tokens/s's ticks were 870, 922, 973, 1,024, 1,075 (a power-of-two scale's steps), the flat
    peak memory's 1.1 GiB four times."""
    for title, chart in charts.items():
        ticks = _y_ticks(chart)
        assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), (title, ticks)
        numbers = [float(re.sub(r"[^\d.]", "", tick)) for tick in ticks]
        steps = {round(b - a, 9) for a, b in zip(numbers, numbers[1:])}
        assert len(steps) == 1, (title, ticks)  # even
        (step,) = steps
        mantissa = step / 10 ** math.floor(math.log10(abs(step)))
        assert round(mantissa, 6) in (1, 2, 2.5, 5), (title, ticks)  # round
        assert all(round(n / step, 6).is_integer() for n in numbers), (title, ticks)
    assert _y_ticks(charts[next(t for t in charts if t.startswith("tokens/s"))])[:2] == ["850", "900"]
    # step times of about 1.02 s: the axis in s, as the tooltips write them (ms only where every figure is under 1 s)
    assert all(tick.endswith(" s") for tick in _y_ticks(charts[next(t for t in charts if "step time" in t)]))


def test_two_nights_of_one_date_have_two_labels(tmp_path, capsys):
    """Two commits measured on one date were two nights under one date label."""
    runs = write_nights(tmp_path / "runs", [1000.0] * 6)
    second = tmp_path / "runs" / "night005"  # night 5's runs: moved to night 4's date, another commit
    for path in second.glob("*.json"):
        path.write_text(path.read_text().replace(night_date(5), night_date(4)))
    page = _page(tmp_path, capsys, runs, "--metric", "tokens_per_s")
    (chart,) = _charts(page).values()
    labels = re.findall(r'text-anchor="middle">([^<]*)</text>', chart)
    assert len(labels) == 6 and len(set(labels)) == 6, labels
    assert labels[4:] == [f"{night_date(4)} c004000", f"{night_date(4)} c005000"]


def test_nights_alike_in_date_and_commit_are_numbered():
    from hwbench.history.page import night_labels
    from hwbench.history.series import Night

    def night(date: str, commit: str) -> Night:
        return Night(date, commit, f"{date}T02:00:00+00:00", [1.0], ["r"], {})

    labels = night_labels([night("2026-10-01", "a" * 40), night("2026-10-02", "b" * 40), night("2026-10-02", "b" * 40)])
    assert labels == ["2026-10-01", "2026-10-02 bbbbbbb #1", "2026-10-02 bbbbbbb #2"]
