"""The two kinds of error a user sees as one line and exit status 2."""


class UsageError(Exception):
    """A bad option value or combination. The message names the option, the
    value and what would be accepted; the CLI prints it as one line, exits 2
    and writes nothing."""

    exit_code = 2


class SetupError(Exception):
    """The machine lacks what the chosen device needs (a driver, a package, a
    runtime). The message says what is missing and how to fix it; exit 2."""

    exit_code = 2


class RankFailure(RuntimeError):
    """One rank of a torchrun job failed while training. The message starts with
    the status it implies (failed, oom, invalid); torchrun's error file carries
    it, with the traceback, to the launcher (hwbench.harness.launcher)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled as Ctrl-C: a CI job cancelled, a terminal closed, a pod
    deleted. ``args[0]`` names the signal; ``signal_number`` is its number."""

    def __init__(self, signal_number: int) -> None:
        import signal

        super().__init__(signal.Signals(signal_number).name)
        self.signal_number = signal_number
