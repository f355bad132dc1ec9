"""What an option of a command is and how its value is checked, one way for every command:
``Option`` (help, default, accepted values or range, Megatron-LM's names) checks a value from
the API, a suite or the command line and refuses it in one line naming the flag, the value and
what is accepted; ``argument`` is the argparse ``type`` of a command's own argument, checked by
an Option. Below the workload layer (``hwbench data prepare``'s options use it) and above
nothing but errors: hwbench/options.py holds the run options themselves."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from hwbench.errors import UsageError

WORKLOAD = "workload"  # the help group of an option that sets what is trained


@dataclasses.dataclass(frozen=True)
class Option:
    """One `hwbench run` option. ``default`` is its value when not given; where that depends
    on the workload or other options, ``default`` is None and ``default_rule`` says it in
    words. What is accepted: ``choices``, or a range (``minimum``, exclusive when
    ``above_minimum``, ``maximum``), and ``valid`` for a format; ``accepts`` names such a
    value after "give" in messages and docs. ``name`` and ``type`` come from the field."""

    help: str
    default: Any = None
    default_rule: str | None = None
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    above_minimum: bool = False
    valid: Callable[[Any], bool] | None = None
    accepts: str | None = None
    group: str = WORKLOAD
    megatron: tuple[str, ...] = ()  # Megatron-LM's flags for the same option
    normalize: Callable[[Any], Any] | None = None  # a value of another type as this option's (a number for text)
    name: str = ""
    type: type = str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default_text(self) -> str | None:
        if self.default_rule is not None or self.default is None:
            return self.default_rule
        return ("on" if self.default else "off") if self.type is bool else _number(self.default)

    @property
    def accepted(self) -> str:
        """What a value must be, as the end of "give ...": "an integer from 1 to 1000000"."""
        if self.type is bool or self.choices:
            return "true or false" if self.type is bool else "one of " + ", ".join(map(str, self.choices))
        text = self.accepts or {int: "an integer", float: "a number"}.get(self.type, "text")
        low, high = self.minimum, self.maximum
        if low is not None and high is not None and not self.above_minimum:
            return f"{text} from {_number(low)} to {_number(high)}"
        if low is not None:
            text += f" {'>' if self.above_minimum else '>='} {_number(low)}" + ("," if high is not None else "")
        return text + (f" at most {_number(high)}" if high is not None else "")

    def check(self, value: Any, shown: str | None = None) -> Any:
        """``value`` (from the API, a suite or the command line) as this option takes it;
        else UsageError, one line naming the option, the value (``shown``, or its repr) and
        what is accepted."""
        if self.normalize is not None:
            value = self.normalize(value)
        if not self._accepts(value):
            shown = shown or repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise UsageError(f"{self.flag} {shown} is not accepted; give {self.accepted}")
        return float(value) if self.type is float else value

    def parse(self, text: str) -> Any:
        """A command-line (or suite) string as this option's value, checked; a number is
        named in a refusal as it was typed, anything else in quotes."""
        if self.type not in (int, float):
            return self.check(text, shown=repr(text))  # for a switch: refused, true or false
        try:
            number = self.type(text)
        except (ValueError, OverflowError):
            return self.check(text)
        return self.check(number, shown=text)

    def _accepts(self, value: Any) -> bool:
        return (isinstance(value, bool) == (self.type is bool)
                and isinstance(value, (int, float) if self.type is float else self.type) and self._in_range(value)
                and (not self.choices or value in self.choices) and (self.valid is None or self.valid(value)))

    def _in_range(self, value: Any) -> bool:
        low, high = self.minimum, self.maximum
        try:
            return ((self.type is not float or math.isfinite(value))
                    and (low is None or value > low or (value == low and not self.above_minimum))
                    and (high is None or value <= high))
        except OverflowError:  # an int past a float's range
            return False


def _number(value: Any) -> str:
    """1800.0 as 1800; text as it is."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def argument(flag: str, kind: type = str, **rules: Any) -> Callable[[str], Any]:
    """The argparse ``type`` of a command's own argument (one that is no run option, such as
    `hwbench k8s --nnodes`), checked by an Option as run options are: one line naming the flag,
    the value as typed and what is accepted. ``rules``: Option's choices, range, valid, accepts."""
    return Option(help="", name=flag.removeprefix("--").replace("-", "_"), type=kind, **rules).parse
