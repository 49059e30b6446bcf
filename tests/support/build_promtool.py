"""Build Prometheus's `promtool` (and the Pushgateway) from the Go module proxy, once.

`promtool check metrics` is Prometheus's own parser and linter of the text format: the tests hold
every run's metrics.prom to it. The Pushgateway is what `--pushgateway` pushes to. Both are cached
under tests/.cache/prometheus-v<version>/bin (see go_build.py).

    python3 tests/support/build_promtool.py        # build if missing, print the bin dir
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import go_build  # noqa: E402  (needs the path above)
from go_build import BuildError, GoCommand  # noqa: E402

PROMETHEUS_VERSION = "v0.316.0"
PUSHGATEWAY_VERSION = "v1.11.5"
COMMANDS = (
    GoCommand(
        "promtool",
        "github.com/prometheus/prometheus",
        PROMETHEUS_VERSION,
        "github.com/prometheus/prometheus/cmd/promtool",
    ),
    GoCommand(
        "pushgateway",
        "github.com/prometheus/pushgateway",
        PUSHGATEWAY_VERSION,
        "github.com/prometheus/pushgateway",
    ),
)
NAME = "prometheus"
BIN_DIR = go_build.bin_dir(NAME, PROMETHEUS_VERSION)
ENV_VAR = "RLDEMO_PROMTOOL_BIN"

__all__ = ["BIN_DIR", "BuildError", "binaries_present", "ensure_built"]


def binaries_present(bin_dir: Path = BIN_DIR) -> bool:
    return go_build.binaries_present(bin_dir, COMMANDS)


def ensure_built(log: Callable[..., None] = print) -> Path:
    """The directory holding promtool and pushgateway, building the missing ones first."""
    return go_build.ensure_built(NAME, PROMETHEUS_VERSION, COMMANDS, log)


def main() -> int:
    try:
        print(ensure_built())
    except BuildError as error:
        print(f"cannot build promtool: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
