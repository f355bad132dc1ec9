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

from hwbench.errors import Terminated

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
    if die_with_parent(int(text)):
        os.environ[PARENT_ENV] = str(os.getpid())


def die_with_parent(parent_pid: int) -> bool:
    """Ask the kernel to SIGKILL this process when ``parent_pid`` (its parent) ends; exit
    at once when that parent is already gone. False where prctl is missing (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:  # the parent died before the request: nothing will ever signal us
        os._exit(128 + signal.SIGKILL)
    return True


def raise_terminated(signal_number: int, _frame) -> None:
    """A signal handler: SIGTERM and SIGHUP end what is running as Ctrl-C does."""
    raise Terminated(signal_number)


@contextlib.contextmanager
def stop_signals():
    """While inside, SIGTERM and SIGHUP raise Terminated (a KeyboardInterrupt naming the
    signal), as Ctrl-C does. Main thread only. `hwbench` commands have them for their whole
    run (cli.main); this is for the same library calls made from the Python API."""
    previous = {sig: signal.signal(sig, raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
