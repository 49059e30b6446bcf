"""Unit tests of what lets a run be found and reaped without its receipt: the annotations
its namespace is created with, `--ttl` and `--stale` durations, a run's state as `list`
shows it, and what `cleanup --stale` decides for each run (pure functions, no cluster).
"""

from __future__ import annotations

import calendar
import json
from typing import Any

import pytest

import rl_batch_demo as demo
from rl_batch_demo import main

NAMESPACE = "agc-rl-0123456789ab"
RUN_ID = "0123456789ab"
T0 = calendar.timegm((2026, 11, 29, 20, 0, 0))


@pytest.mark.parametrize("text, seconds", [
    ("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("2H", 7200), (" 45m ", 2700),
    ("1d2h3m4s", 86400 + 7200 + 180 + 4),
])
def test_durations_are_read_in_seconds(text: str, seconds: int) -> None:
    assert demo.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "h", "2x", "1.5h", "-1h", "0s", "0h0m", "2h junk", "30 m", "m30"])
def test_a_bad_duration_is_refused_with_its_text(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        demo.parse_duration(text)


@pytest.mark.parametrize("seconds, shown", [
    (0, "0s"), (45.9, "45s"), (119, "119s"), (120, "2m"), (3599, "59m"), (3600, "1h"), (3660, "1h1m"),
    (86399, "23h59m"), (86400, "24h"), (2 * 86400 + 4 * 3600 + 59, "2d4h"), (-5, "0s"),
])
def test_durations_are_shown_as_kubectl_shows_an_age(seconds: float, shown: str) -> None:
    assert demo.format_duration(seconds) == shown


def test_times_are_written_as_kubernetes_writes_them() -> None:
    assert demo.rfc3339(T0 + 0.9) == "2026-11-29T20:00:00Z"
    assert demo.parse_time(demo.rfc3339(T0)) == T0


def origin(**changes: Any) -> demo.RunOrigin:
    fields = dict(run_id=RUN_ID, version="0.1.0", host="bastion-1", output="/home/me/runs/first",
                  user="alice@example.com", expires_at=None)
    fields.update(changes)
    return demo.RunOrigin(**fields)


def test_the_namespace_says_who_made_the_run_and_from_where() -> None:
    manifest = demo.namespace_manifest(NAMESPACE, RUN_ID, origin=origin())
    assert manifest == {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"agc-demo-run": RUN_ID}, "annotations": {
            "rl-batch-demo.agc/run-id": RUN_ID, "rl-batch-demo.agc/version": "0.1.0",
            "rl-batch-demo.agc/host": "bastion-1", "rl-batch-demo.agc/output": "/home/me/runs/first",
            "rl-batch-demo.agc/user": "alice@example.com"}},
    }


def test_a_ttl_puts_the_expiry_on_the_namespace() -> None:
    annotations = demo.namespace_manifest(NAMESPACE, RUN_ID, harden=True, origin=origin(expires_at=T0 + 7200))[
        "metadata"]["annotations"]
    assert annotations["rl-batch-demo.agc/expires-at"] == "2026-11-29T22:00:00Z"


def test_the_guides_namespace_has_no_annotations() -> None:
    assert "annotations" not in demo.namespace_manifest(NAMESPACE, RUN_ID)["metadata"]


def test_dry_run_shows_the_annotations_and_the_expiry(tmp_path, capsys) -> None:
    output = tmp_path / "out"
    assert main(["run", "--dry-run", "--output", str(output), "--ttl", "30m"]) == 0
    namespace = json.loads(capsys.readouterr().out)["items"][0]
    annotations = namespace["metadata"]["annotations"]
    assert annotations["rl-batch-demo.agc/run-id"] == namespace["metadata"]["labels"]["agc-demo-run"]
    assert annotations["rl-batch-demo.agc/output"] == str(output.resolve())
    assert annotations["rl-batch-demo.agc/user"] == demo.USER_UNKNOWN_BEFORE_RUN
    expires = demo.parse_time(annotations["rl-batch-demo.agc/expires-at"])
    assert 1700 < expires - demo.time.time() <= 1800
    assert not output.exists()


def test_a_bad_ttl_is_a_usage_error(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--output", str(tmp_path / "out"), "--ttl", "soon"])
    assert exit_.value.code == 2
    assert "not a duration: 'soon'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_run_batch_takes_the_ttl_as_the_flag_does(tmp_path) -> None:
    listing = demo.run_batch(output=tmp_path / "out", count=1, dry_run=True, ttl="1h30m")
    expires = demo.parse_time(listing["items"][0]["metadata"]["annotations"]["rl-batch-demo.agc/expires-at"])
    assert 5300 < expires - demo.time.time() <= 5400
    with pytest.raises(demo.UsageError, match="ttl='soon'"):
        demo.run_batch(output=tmp_path / "out", count=1, dry_run=True, ttl="soon")
