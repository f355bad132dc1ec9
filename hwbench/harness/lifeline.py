"""Every process hwbench starts dies with the process that started it.

hwbench's process trees are deep: `hwbench sweep` starts `hwbench run` for a point,
which starts torchrun's agent, which starts the ranks. A parent that is killed
outright (SIGKILL, the OOM killer, a CI job cancelled) runs no cleanup, and its
children would be re-parented to init and run on, holding devices and ports and
leaving their results where nobody looks. So each child asks the kernel, first
thing, to SIGKILL it when its parent dies (Linux's PR_SET_PDEATHSIG), and the
parent names itself in the child's environment so that a child whose parent is
already gone (the race between fork and that request) exits at once.

    parent:  subprocess.Popen(..., env=child_environment(env))
    child:   hold()   # first thing in main()

The kernel sends the signal when the parent *thread* that forked the child ends,
so a parent starts its children from its main thread (all of hwbench's do).

A process asked to stop (SIGTERM from a scheduler, SIGHUP from a closed terminal)
stops as Ctrl-C stops it (stop_signals), so the same cleanup ends its children.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PARENT_ENV = "HWBENCH_PARENT_PID"
PR_SET_PDEATHSIG = 1


def child_environment(environment: dict[str, str] | None = None) -> dict[str, str]:
    """``environment`` (default: this process's) for a child that must die with this process."""
    return {**(os.environ if environment is None else environment), PARENT_ENV: str(os.getpid())}


def hold() -> None:
    """When hwbench started this process (PARENT_ENV set): die with that parent. Also
    names this process as the parent for its own children (torchrun's ranks inherit
    the agent's environment). Without prctl (not Linux) nothing is done."""
    text = os.environ.get(PARENT_ENV)
    if not text or not text.isdigit():
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != int(text):  # the parent died before the request: nothing will ever signal us
        os._exit(128 + signal.SIGKILL)
    os.environ[PARENT_ENV] = str(os.getpid())


@contextlib.contextmanager
def stop_signals():
    """While inside, SIGTERM and SIGHUP raise KeyboardInterrupt (with their ``signal_number``),
    as Ctrl-C does: the one place hwbench handles them. Main thread only."""

    def stop(signal_number, _frame):
        stopped = KeyboardInterrupt(signal.Signals(signal_number).name)
        stopped.signal_number = signal_number  # type: ignore[attr-defined]
        raise stopped

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
