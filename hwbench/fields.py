"""Field types of the files hwbench reads (results, baselines, checkpoint manifests) and
their validation problems as one line: one place, so every file's refusal reads the same."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, Strict, ValidationError

MAX_COUNT = 2**63 - 1  # what a 64-bit counter holds; SQLite's integers too

Figure = Annotated[float, Strict()]  # a measured figure: finite (the models refuse NaN and infinities)
Rate = Annotated[float, Strict(), Field(ge=0)]  # samples/s, FLOP/s, watts, joules, seconds: never negative
Count = Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
Positive = Annotated[int, Strict(), Field(ge=1, le=MAX_COUNT)]
Integer = Annotated[int, Strict(), Field(ge=-MAX_COUNT, le=MAX_COUNT)]
Text = Annotated[str, Strict()]
Flag = Annotated[bool, Strict()]


# --- validation problems as one line ------------------------------------------------------------


def validation_problem(model: type[BaseModel], data: Any, where: str = "") -> str | None:
    """Where ``data`` departs from ``model``, as "field: what is wrong", or None when it fits."""
    try:
        model.model_validate(data)
    except ValidationError as error:
        return problem_text(error, where)
    return None


def problem_text(error: ValidationError, where: str = "") -> str:
    """The first problem of a ValidationError as one line: "metrics.mfu: must be >= 0, not -1"."""
    first = error.errors(include_url=False)[0]
    path = where
    for part in first["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{path or 'the file'}: {_problem(first)}"[:300]


_PROBLEMS = {  # pydantic's error type -> the line it makes, as hwbench has always said it
    "missing": "is missing",
    "finite_number": "must be a finite number, not {value!r}",
    "float_type": "must be a number, not {kind}",
    "int_type": "must be an integer, not {kind}",
    "string_type": "must be text, not {kind}",
    "bool_type": "must be true/false, not {kind}",
    "model_type": "must be a mapping, not {kind}",
    "dict_type": "must be a mapping, not {kind}",
    "list_type": "must be a list, not {kind}",
    "too_short": "must hold at least {min_length}, not {actual_length}",
    "extra_forbidden": "is not a field here",
    "greater_than": "must be > {gt}, not {short}",
    "greater_than_equal": "must be >= {ge}, not {short}",
    "less_than_equal": "must be <= {le}, not {short}",
    "literal_error": "must be one of {expected}, not {short}",
    "recursion_loop": "nested too deeply",
}


def _problem(error: Any) -> str:
    value, kind = error.get("input"), error["type"]
    if kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        return f"must be a number a float holds, not an integer of {len(str(abs(value)))} digits"
    template = _PROBLEMS.get(kind)
    if template is None:
        return str(error.get("msg"))
    return template.format(value=value, kind=_kind(value), short=_short(value), **(error.get("ctx") or {}))


def _kind(value: Any) -> str:
    names = {
        dict: "a mapping",
        list: "a list",
        str: "text",
        bool: "true/false",
        type(None): "null",
        int: "an integer",
        float: "a number",
    }
    return names.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
