"""Build Jaeger v2 (`cmd/jaeger`, an OpenTelemetry Collector distribution) from the Go module
proxy, once, for the tests that read the tool's traces back through Jaeger's query API.

Its go.mod has a replace directive, so it cannot be `go install`ed: go_build.py builds it in a
module of its own. Built from the proxy it carries no UI assets (the UI is built with npm in
Jaeger's own release); the query API (/api/traces) is all the tests need. Cached under
tests/.cache/jaeger-v<version>/bin.

    python3 tests/support/build_jaeger.py        # build if missing, print the bin dir
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import go_build  # noqa: E402  (needs the path above)
from go_build import BuildError, GoCommand  # noqa: E402

JAEGER_VERSION = "v1.75.0"
COMMANDS = (
    GoCommand(
        "jaeger",
        "github.com/jaegertracing/jaeger",
        JAEGER_VERSION,
        "github.com/jaegertracing/jaeger/cmd/jaeger",
    ),
)
NAME = "jaeger"
BIN_DIR = go_build.bin_dir(NAME, JAEGER_VERSION)
ENV_VAR = "RLDEMO_JAEGER_BIN"

__all__ = ["BIN_DIR", "BuildError", "binaries_present", "ensure_built"]


def binaries_present(bin_dir: Path = BIN_DIR) -> bool:
    return go_build.binaries_present(bin_dir, COMMANDS)


def ensure_built(log: Callable[..., None] = print) -> Path:
    """The directory holding jaeger, building it first if missing."""
    return go_build.ensure_built(NAME, JAEGER_VERSION, COMMANDS, log)


def main() -> int:
    try:
        print(ensure_built())
    except BuildError as error:
        print(f"cannot build jaeger: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
