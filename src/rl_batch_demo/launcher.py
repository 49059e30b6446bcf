"""How a rollout's pod runs its episode: the program's own end recorded, the pod's left to others.

The container runs `python -B -c <this text>`, which runs /demo/episode.py in this very process
(as __main__, sys.argv[0] its path), so the episode's start-up figures stay its own. In a Job of
several (one per image) it first sets EPISODE_INDEX and TASK_FILE from the run-wide indexes of
its Job's completion indexes (EPISODE_INDEXES).

When the program ends on its own with a failure (a non-zero exit, an uncaught exception,
os._exit) or is still running EPISODE_TIMEOUT_SECONDS after this process started, one JSON event
`episode_exit` on stdout says so (`exit_code`, or `timed_out` and `timeout_seconds`), and the
process exits 0. So the pod fails only when something outside the program ends it (an eviction,
an OOM kill, the Job's end, the pod's own deadline): a failed pod is the infrastructure's, which
the Job retries under backoffLimitPerIndex and counts under maxFailedIndexes, while the episode's
own failure is a sample. A program that handles SIGTERM (the kubelet's stop, as a suspended or
ended Job deletes its pod) and then ends, however it ends, was ended from outside: the process
exits 143, as if the signal had killed it, and records nothing of its own.

Written for whatever Python 3 an episode image holds: no f-strings, no annotations, and nothing
imported before the episode's own imports but os, runpy and sys (and _signal, loaded at start).
"""

import os
import runpy
import sys

LAUNCHER_PID = os.getpid()
REAL_EXIT = os._exit
EPISODE = "/demo/episode.py"
SIGTERM_EXIT = 128 + 15
# Set once a SIGTERM reached a handler the program installed (as PID 1 it ignores one it does not).
TERMINATED = []  # type: list[int]


def emit_exit(**fields):
    """The episode_exit event on stdout, after whatever the program printed."""
    import json
    import time

    record = {
        "event": "episode_exit",
        "at": time.time(),
        "episode_id": os.environ.get("EPISODE_ID", ""),
    }
    record.update(fields)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        os.write(1, (json.dumps(record) + "\n").encode("utf-8"))
    except OSError:
        pass


def exit_status(code):
    """The status a SystemExit's code ends a process with, its message printed as Python does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write("%s\n" % (code,))
    except Exception:
        pass
    return 1


def ended(status):
    """The program ended with this status: a failure is recorded; either way the process ends 0,
    unless a SIGTERM came first (its stop is not the episode's end)."""
    if TERMINATED:
        sys.exit(SIGTERM_EXIT)
    if status != 0:
        emit_exit(exit_code=status)
    sys.exit(0)


def own_exit(code):
    """os._exit as the program calls it: in this process, recorded like any other end."""
    if os.getpid() == LAUNCHER_PID:
        if TERMINATED:
            REAL_EXIT(SIGTERM_EXIT)
        status = code & 0xFF
        if status != 0:
            emit_exit(exit_code=status)
        REAL_EXIT(0)
    REAL_EXIT(code)


def noting_sigterm(handler):
    """The program's SIGTERM handler, run after noting that the signal came (TERMINATED)."""

    def handle(signum, frame):
        TERMINATED.append(signum)
        return handler(signum, frame)

    handle.episode_handler = handler  # type: ignore[attr-defined]
    return handle


def watch_sigterm():
    """Every SIGTERM handler the program installs (signal.signal calls _signal.signal) noted."""
    try:
        import _signal  # type: ignore[import-not-found]  # loaded as Python starts: costs nothing
    except ImportError:  # a Python before 3.5, whose signal module is its C module itself
        return

    install, current = _signal.signal, _signal.getsignal

    def signal(signalnum, handler):
        if signalnum == _signal.SIGTERM and callable(handler):
            handler = noting_sigterm(getattr(handler, "episode_handler", handler))
        before = install(signalnum, handler)
        return getattr(before, "episode_handler", before)

    def getsignal(signalnum):
        handler = current(signalnum)
        return getattr(handler, "episode_handler", handler)

    _signal.signal, _signal.getsignal = signal, getsignal


def watch(seconds):
    """The episode's own time: past it, recorded as such, and the process ends at once."""
    import time

    time.sleep(seconds)
    emit_exit(timed_out=True, timeout_seconds=seconds)
    REAL_EXIT(0)


def run_wide_index():
    """In a Job of several: this pod's run-wide episode index, its task file named by it."""
    indexes = []  # type: list[int]
    for piece in os.environ["EPISODE_INDEXES"].split(","):
        first, _, last = piece.partition("-")
        indexes += range(int(first), int(last or first) + 1)
    index = indexes[int(os.environ["JOB_COMPLETION_INDEX"])]
    os.environ["EPISODE_INDEX"] = str(index)
    os.environ["TASK_FILE"] = "/tasks/%d.json" % index


def main():
    if "EPISODE_INDEXES" in os.environ:
        run_wide_index()
    timeout = os.environ.get("EPISODE_TIMEOUT_SECONDS")
    if timeout:
        import _thread

        _thread.start_new_thread(watch, (int(timeout),))
    os._exit = own_exit
    watch_sigterm()
    sys.argv, sys.path[0] = [EPISODE], os.path.dirname(EPISODE)
    try:
        runpy.run_path(EPISODE, run_name="__main__")
    except SystemExit as stop:
        ended(exit_status(stop.code))
    except BaseException:
        sys.excepthook(*sys.exc_info())
        ended(1)


if __name__ == "__main__":
    main()
