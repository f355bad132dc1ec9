"""torchrun, as a child process of the launcher, with its failures written down.

    python -m hwbench.harness.agent RUN_DIR -- TORCHRUN_ARGS...

runs torch.distributed.run (the torchrun agent) with TORCHRUN_ARGS and writes
``RUN_DIR/agent.json``: ``{"status": "ok"}``, ``{"status": "stopped", "signal":
"SIGTERM"}`` (the agent itself was signalled) or ``{"status": "failed",
"failures": [...]}`` with, for every failed rank (AgentFailure), its exit code, the signal
that killed it, and the error file its ``@record``-ed entry point wrote
(torch.distributed.elastic's ``record`` decorator and TORCHELASTIC_ERROR_FILE, in PyTorch's
elastic error-handling documentation). torchrun itself only prints these; the launcher needs them as data.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class AgentFailure:
    """One failed rank as the agent writes it in agent.json (the launcher reads it back)."""

    rank: int
    local_rank: int | None = None
    pid: int | None = None
    exitcode: int | None = None
    signal: str | None = None  # the signal that killed it, by name
    message: str | None = None
    error_file_data: dict[str, Any] | None = None  # what its @record-ed entry point wrote: torch's format
    timestamp: int | None = None


def _failure_record(rank: int, failure: Any) -> AgentFailure:
    signal_name = None
    if failure.exitcode is not None and failure.exitcode < 0:
        try:
            signal_name = failure.signal_name()
        except Exception:  # an exit code that is no signal number
            signal_name = f"signal {-failure.exitcode}"
    return AgentFailure(rank, failure.local_rank, failure.pid, failure.exitcode, signal_name, failure.message,
                        failure.error_file_data or None, failure.timestamp)


def _write(run_dir: Path, record: dict[str, Any]) -> None:
    from hwbench.files import write_json_atomic
    from hwbench.harness.faults import AGENT_FILE

    write_json_atomic(run_dir / AGENT_FILE, record)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] != "--":
        print("usage: python -m hwbench.harness.agent RUN_DIR -- TORCHRUN_ARGS...", file=sys.stderr)
        return 2
    from hwbench.lifeline import hold

    hold()  # die with the launcher; the ranks, which inherit this environment, die with us
    run_dir = Path(argv[0])
    # torchrun logs every worker it stops at WARNING: when the launcher ends a run (Ctrl-C, --timeout)
    # the user gets hwbench's one line, not torch's; failures are written down below as data.
    os.environ.setdefault("LOGLEVEL", "ERROR")
    logging.getLogger("torch.distributed.elastic").setLevel(os.environ["LOGLEVEL"])
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv[2:]))
    except SignalException as stopped:  # torchrun has stopped the ranks; the launcher reads why
        _write(run_dir, {"status": "stopped", "signal": signal.Signals(stopped.sigval).name})
        return 128 + int(stopped.sigval)
    except ChildFailedError as error:
        failures = [_failure_record(rank, failure) for rank, failure in sorted(error.failures.items())]
        _write(run_dir, {"status": "failed", "failures": [dataclasses.asdict(failure) for failure in failures]})
        return 1
    _write(run_dir, {"status": "ok"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
