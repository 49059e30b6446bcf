"""The guardian: kills a tool process's kubectl process groups once that process is gone.

Run as `python -I -S -c <this text>` with its standard input the far end of a socket the tool
holds. The tool (or each kubectl, just before it execs) writes "+GROUP\n" for each process group
it starts and "-GROUP\n" for each it has stopped and waited for. When the socket's last writer is
gone, however the tool ended (SIGKILL included), every group still named is killed.
"""

from __future__ import annotations

import os
import signal
from typing import Callable


def named_groups(read: Callable[[], bytes]) -> set[int]:
    """The groups still named once the stream ends: each "+N" adds N, each "-N" takes it away."""
    groups: set[int] = set()
    pending = b""
    while True:
        try:
            chunk = read()
        except OSError:
            break  # the stream broke: as good as ended
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            sign, number = line[:1], line[1:]
            if number.isdigit() and sign == b"+":
                groups.add(int(number))
            elif number.isdigit() and sign == b"-":
                groups.discard(int(number))
    return groups


def main() -> None:
    # Out of the terminal's reach already (a session of its own); a hang-up or Ctrl-C meant for
    # the tool must not end the one process that outlives it.
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    for group in sorted(named_groups(lambda: os.read(0, 65536))):
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass  # that group has ended already


if __name__ == "__main__":
    main()
