"""Jaeger v2 on loopback for the tests: in-memory storage, its OTLP HTTP receiver and its query
API, from a config file written here; and the Pushgateway, likewise.

    with Jaeger(bin_dir, workdir) as jaeger:
        ... run the tool with --otlp-endpoint jaeger.otlp_url ...
        trace = jaeger.trace(trace_id)      # /api/traces/<id>: spans with startTime/duration in µs

Given `ui_assets` (a built jaeger-ui directory: Jaeger built from the module proxy has none), it
serves that UI at `query_url` too (tests/support/jaeger_screenshot.py).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn

extensions:
  jaeger_query:
    storage:
      traces: memstore
    # Times as sent: no clock-skew adjustment of a child's span against its parent's.
    max_clock_skew_adjust: 0s
    enable_tracing: false{ui}
    http:
      endpoint: 127.0.0.1:{query_http}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}

  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000

receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp_http}

processors:
  batch:
    timeout: 100ms

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.loads(answer.read())


class Jaeger:
    """One Jaeger process: `otlp_url` to export to, `query_url` to read back."""

    def __init__(self, bin_dir: Path, workdir: Path, ui_assets: Path | None = None) -> None:
        self.binary = bin_dir / "jaeger"
        self.workdir = workdir
        ports = {"otlp_http": free_port(), "query_http": free_port(), "query_grpc": free_port()}
        self.otlp_url = f"http://127.0.0.1:{ports['otlp_http']}"
        self.query_url = f"http://127.0.0.1:{ports['query_http']}"
        self.config = workdir / "jaeger.yaml"
        ui = f"\n    ui:\n      assets_path: {json.dumps(str(ui_assets))}" if ui_assets else ""
        self.config.write_text(CONFIG.format(ui=ui, **ports))
        self.log = workdir / "jaeger.log"
        self.process: subprocess.Popen | None = None

    def start(self, seconds: float = 60.0) -> None:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [str(self.binary), "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"jaeger exited {self.process.returncode}: {self.log.read_text()}"
                )
            try:
                get_json(f"{self.query_url}/api/services", timeout=1.0)
                urllib.request.urlopen(  # the receiver answers too (405 to a GET: it is there)
                    f"{self.otlp_url}/v1/traces", timeout=1.0
                )
                return
            except urllib.error.HTTPError:
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise RuntimeError(f"jaeger not serving after {seconds:.0f} s: {self.log.read_text()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crashed collector: nothing flushed, the port closed."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Jaeger:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def trace(self, trace_id: str, spans: int, seconds: float = 30.0) -> dict:
        """The trace as Jaeger's query API gives it, once it holds `spans` spans (the batch
        processor and storage take a moment)."""
        deadline = time.monotonic() + seconds
        found: dict = {}
        while time.monotonic() < deadline:
            try:
                data = get_json(f"{self.query_url}/api/traces/{trace_id}").get("data") or []
            except urllib.error.HTTPError as error:
                if error.code != 404:
                    raise
                data = []
            if data:
                found = data[0]
                if len(found["spans"]) >= spans:
                    return found
            time.sleep(0.3)
        raise AssertionError(
            f"trace {trace_id} has {len(found.get('spans', []))} of {spans} spans in Jaeger"
        )


class Pushgateway:
    """One Pushgateway process on loopback, in memory (no persistence file)."""

    def __init__(self, bin_dir: Path, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.binary = bin_dir / "pushgateway"
        self.log = workdir / "pushgateway.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Pushgateway:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [str(self.binary), f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0)
                return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise RuntimeError(f"pushgateway not ready: {self.log.read_text()}")

    def __exit__(self, *exc: Any) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5.0) as answer:
            return answer.read().decode()
