"""Field types of the files hwbench reads (results, baselines, checkpoint manifests) and
their validation problems as one line: one place, so every file's refusal reads the same."""

from __future__ import annotations

from typing import Annotated, Any, get_args

from pydantic import AfterValidator, BaseModel, Field, Strict, ValidationError
from pydantic_core import PydanticCustomError

MAX_COUNT = 2**63 - 1  # what a 64-bit counter holds; SQLite's integers too

Figure = Annotated[float, Strict()]  # a measured figure: finite (the models refuse NaN and infinities)
Rate = Annotated[float, Strict(), Field(ge=0)]  # samples/s, FLOP/s, watts, joules, seconds: never negative
Count = Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]
Positive = Annotated[int, Strict(), Field(ge=1, le=MAX_COUNT)]
Integer = Annotated[int, Strict(), Field(ge=-MAX_COUNT, le=MAX_COUNT)]
Text = Annotated[str, Strict()]
Flag = Annotated[bool, Strict()]

# A name hwbench makes a file or folder of (a run id, a suite or point name) is one name in its folder:
# what FILE_NAME_RULE says, and short enough that the name plus what hwbench adds to it
# (`.json`, a temporary file's prefix and suffix) stays under the 255 bytes file systems hold.
FILE_NAME_RULE = "not empty, '.' or '..', no '/', '\\' or control characters, at most {limit} bytes"


def is_file_name(name: str, limit: int = 200) -> bool:
    """Whether ``name`` is one file or folder name in its folder (FILE_NAME_RULE): joined to
    a folder it can name nothing outside it, neither the folder itself nor its parent."""
    return (bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name
            and not any(ord(c) < 32 or ord(c) == 127 for c in name) and len(name.encode("utf-8", "replace")) <= limit)


# A sweep's run id is its stamp, the point's name (up to 200 bytes) and `-sweep-` with 6 hex digits.
RUN_ID_BYTES = 240


def _file_name(run_id: str) -> str:
    """The run id names the result's file and every folder an export makes of it (`<out>/<run id>`):
    one name in its folder, never `..` (the parent), `.` or '' (the folder itself) or a path."""
    if not is_file_name(run_id, RUN_ID_BYTES):
        raise PydanticCustomError("file_name", "must be a file name ({rule}), not {short}",
                                  {"rule": FILE_NAME_RULE.format(limit=RUN_ID_BYTES), "short": _short(run_id)})
    return run_id


RunId = Annotated[str, Strict(), AfterValidator(_file_name)]


# --- validation problems as one line ------------------------------------------------------------


def validation_problem(model: type[BaseModel], data: Any, where: str = "") -> str | None:
    """Where ``data`` departs from ``model``, as "field: what is wrong", or None when it fits."""
    try:
        model.model_validate(data)
    except ValidationError as error:
        return problem_text(error, where)
    return None


def problem_text(error: ValidationError, where: str = "", model: type[BaseModel] | None = None) -> str:
    """The first problem of a ValidationError as one line: "metrics.mfu: must be >= 0, not -1"; a
    field ``model`` does not declare is named with the fields it does."""
    first = error.errors(include_url=False)[0]
    path = where
    for part in first["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    text = f"{path or 'the file'}: {_problem(first)}"
    known = _field_names(model, first["loc"][:-1]) if model and first["type"] == "extra_forbidden" else None
    if known:
        text += f"; the fields here are: {', '.join(known)}"
    return text[:600]


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """The fields of the mapping at ``loc`` in ``model``, sorted; None where no model is declared there."""
    found: type[BaseModel] | None = model
    for part in loc:
        if found is None:
            return None
        if isinstance(part, str):
            field = found.model_fields.get(part)
            found = _model_in(field.annotation) if field else None
    return sorted(found.model_fields) if found else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds (``X | None``, ``list[X]``, ``Annotated[X, ...]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


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
    "string_too_short": "must not be empty",
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
