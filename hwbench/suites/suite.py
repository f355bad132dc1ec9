"""Suites: many benchmark points in one YAML file (workloads/suites/*.yaml).

    name: smoke
    description: ...
    defaults:            # `hwbench run` options for every point (names as on the command line,
      model: tiny        #   without the dashes; true/false for switches)
      steps: 3
    points:              # explicit points: each overrides the defaults; `name` is optional,
      - {name: one-rank} #   `env` sets environment variables for that point (NCCL_ALGO, ...)
      - {name: dp2, nproc-per-node: 2, env: {NCCL_ALGO: Ring}}
    grid:                # and/or a grid: every combination of these lists, at the defaults
      tp: [1, 2]
      precision: [fp32, bf16]

A point is the `hwbench run` options it stands for; it is validated
by the same code as `hwbench run` when the sweep reaches it (an impossible
layout is recorded as `invalid`, not fatal to the sweep).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Any

import yaml

from hwbench.errors import UsageError
from hwbench.fields import FILE_NAME_RULE, is_file_name
from hwbench.options import RUN_OPTIONS, RunOptions

SUITE_KEYS = {"name", "description", "defaults", "points", "grid"}
# Options a sweep sets for every point itself; a suite must not.
RESERVED = {"out", "quiet"}


@dataclasses.dataclass(frozen=True)
class Point:
    """One benchmark point of a suite: a name and its `hwbench run` options."""

    name: str
    options: tuple[tuple[str, Any], ...]  # (option, value), in a stable order
    env: tuple[tuple[str, str], ...] = ()  # environment variables for this point's processes

    def run_options(self) -> RunOptions:
        return RunOptions(**dict(self.options))

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    description: str
    path: str | None  # None: built in code (hwbench tune's trials)
    points: tuple[Point, ...]


def check_name(name: str, where: str) -> str:
    """A suite or point name becomes a folder under the sweep's --out: it must stay a
    single folder name there (no separator, no `..`, no NUL or control character)."""
    if not is_file_name(name):
        raise UsageError(f"{where} {name!r} is not accepted: a name becomes a folder under --out; give letters, "
                         f"digits, '.', '_' or '-' ({FILE_NAME_RULE.format(limit=200)})")
    return name


def _normalise(options: Any, where: str) -> dict[str, Any]:
    """A point's options with `hwbench run`'s names, each value checked by its definition
    (hwbench.options; a string for a number is read as the command line reads it: YAML
    gives `1e-4` as text): an unknown option or a bad value refuses the suite here, not
    every point later."""
    if options is not None and not isinstance(options, dict):
        raise UsageError(f"{where}: must map `hwbench run` options to values, not {options!r}"[:300])
    normalised = {}
    for key, value in (options or {}).items():
        key = str(key).replace("-", "_")
        if key in RESERVED:
            raise UsageError(f"{where}: `{key}` is set by `hwbench sweep` (--out), not by the suite")
        if key not in RUN_OPTIONS:
            raise UsageError(f"{where}: `{key}` is not a `hwbench run` option; accepted: "
                             f"{', '.join(sorted(set(RUN_OPTIONS) - RESERVED))}")
        option = RUN_OPTIONS[key]
        try:
            normalised[key] = (value if value is None else option.parse(value) if isinstance(value, str)
                               else option.check(value))
        except UsageError as error:
            raise UsageError(f"{where}: {error}") from None
    return normalised


def _point_name(options: dict[str, Any], defaults: dict[str, Any]) -> str:
    """A readable name from what differs from the defaults: model-tp2-pp1-bf16..."""
    parts = [str(options.get("model", "default"))]
    for key, value in options.items():
        if key in ("model", "name") or defaults.get(key) == value:
            continue
        if RUN_OPTIONS[key].type is bool:
            parts.append(key if value else f"no-{key}")
        elif key in ("tp", "pp", "dp", "zero"):
            parts.append(f"{key}{value}")
        else:
            parts.append(f"{key.replace('_', '-')}-{value}")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(parts))


def read_yaml_text(path: Path, what: str) -> str:
    """A YAML file's text; UsageError names the file and the byte where it is not UTF-8."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise UsageError(f"{what} {str(path)!r} cannot be read: {error.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"{what} {path}: not UTF-8 text at byte {error.start} ({error.reason}); save it as "
                         "UTF-8") from None


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file; UsageError names the file and the problem."""
    path = Path(path)
    text = read_yaml_text(path, "suite")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise UsageError(f"suite {path}: not valid YAML ({str(error).splitlines()[0]})") from None
    except RecursionError:
        raise UsageError(f"suite {path}: nested too deeply") from None
    except ValueError as error:  # PyYAML builds an unquoted 2026-13-01 as a date and fails
        raise UsageError(f"suite {path}: holds a value YAML cannot read ({error}); write dates as real days, "
                         "YYYY-MM-DD, or quote the text") from None
    if not isinstance(data, dict):
        raise UsageError(f"suite {path}: expected a mapping with {', '.join(sorted(SUITE_KEYS))}")
    unknown = set(data) - SUITE_KEYS
    if unknown:
        raise UsageError(f"suite {path}: unknown key(s) {', '.join(sorted(unknown))}; "
                         f"accepted: {', '.join(sorted(SUITE_KEYS))}")
    defaults = _normalise(data.get("defaults"), f"suite {path} defaults")
    points: list[Point] = []
    for index, entry in enumerate(data.get("points") or []):
        if not isinstance(entry, dict):
            raise UsageError(f"suite {path}: points[{index}] must be a mapping of options")
        entry = dict(entry)
        name = entry.pop("name", None)
        env = entry.pop("env", None) or {}
        if not isinstance(env, dict):
            raise UsageError(f"suite {path}: points[{index}].env must map variable names to values")
        for key, value in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)) or isinstance(value, (list, dict)) \
                    or "\0" in str(value):
                raise UsageError(f"suite {path}: points[{index}].env {str(key)!r}: {str(value)!r}"[:200]
                                 + " is not accepted; give NAME: value, NAME of letters, digits and '_' (not "
                                 "starting with a digit), one value without NUL")
        options = {**defaults, **_normalise(entry, f"suite {path} points[{index}]")}
        if isinstance(name, (list, dict)):
            raise UsageError(f"suite {path}: points[{index}].name must be one name, not {name!r}"[:300])
        point_name = check_name(str(name), f"suite {path} points[{index}].name") if name else None
        points.append(Point(point_name or _point_name(options, defaults), tuple(options.items()),
                            tuple((str(k), str(v)) for k, v in env.items())))
    grid = data.get("grid") or {}
    if grid:
        if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
            raise UsageError(f"suite {path}: grid must map options to non-empty lists of values")
        keys = [str(k).replace("-", "_") for k in grid]
        for values in itertools.product(*grid.values()):
            options = {**defaults, **_normalise(dict(zip(keys, values)), f"suite {path} grid")}
            points.append(Point(_point_name(options, defaults), tuple(options.items())))
    if not points:
        raise UsageError(f"suite {path}: no points (give `points`, `grid` or both)")
    for point in points:  # generated names too: a model or value may hold anything
        check_name(point.name, f"suite {path} point name")
    names = [p.name for p in points]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UsageError(f"suite {path}: point names repeat: {', '.join(duplicates)}; give each a `name`")
    if not isinstance(data.get("name"), (str, int, type(None))):
        raise UsageError(f"suite {path}: name {data.get('name')!r} must be one name, not a list or mapping"[:300])
    name = check_name(str(data.get("name") or path.stem), f"suite {path} name")
    return Suite(name, str(data.get("description") or ""), str(path), tuple(points))


SHIPPED_SUITES = Path(__file__).resolve().parent.parent / "catalogs" / "workloads" / "suites"


def shipped_suite_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED_SUITES.glob("*.yaml"))


def find_suite(name_or_path: str) -> Path:
    """A suite file by path, or by name among the shipped suites."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    for candidate in (SHIPPED_SUITES / name_or_path, SHIPPED_SUITES / f"{name_or_path}.yaml"):
        if candidate.is_file():
            return candidate
    raise UsageError(f"suite {name_or_path!r} is neither a file nor a shipped suite; shipped: "
                     f"{', '.join(shipped_suite_names())}")
