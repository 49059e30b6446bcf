"""End to end, a batch larger than the event recorder names pod by pod.

client-go's event recorder combines events that differ only by message once ten of them
reach one object within ten minutes: past the tenth pod, a Job's SuccessfulCreate events
become one "(combined from similar events)" event, and those pods lose the event name
that gives their creation to the nanosecond. The tool watches the pods from before the
Job exists, so each of them is seen as it is created, and a pod is created after its Job:
their creation is then placed as sharply as the watch's delivery allows, not anywhere in
its creationTimestamp's second.
"""

from __future__ import annotations

import pytest

from e2e_support import load, run_tool
from kube_emulator import Emulator
from test_e2e_phases import KUBECTL_VERSION, Run, named_creation_source, point_errors

import all_names as rl_batch_demo

pytestmark = pytest.mark.e2e

COUNT = 20
# The emulator notes a truth just after the change it records: a point may precede it by this.
TRUTH_NOTED_AFTER = 0.01


def test_pods_past_the_recorders_tenth_are_placed_by_the_watch(require_e2e, tmp_path):
    kubectl = require_e2e(KUBECTL_VERSION)
    emulator = Emulator(tmp_path / "emulator", faults={"sandbox_delay": 0.6, "sandbox_jitter": 0.4})
    emulator.start()
    try:
        output = tmp_path / "rl-20"
        result = run_tool(
            emulator,
            kubectl,
            "run",
            count=COUNT,
            parallelism=COUNT,
            output=output,
            quiet=True,
            verbose=True,
        )
        assert result.returncode == 0, result.stderr
        run = Run(emulator, output, result.stdout)
        # The pod watch was started before the Job was created (in the tool's own order: when its
        # request reaches the server, a loaded machine decides; a watch that lists the pods late
        # states the later moment it saw them).
        commands = [line for line in result.stderr.splitlines() if line.startswith("+ ")]
        watch = next(i for i, c in enumerate(commands) if " get pods " in c and "--watch" in c)
        creates = [i for i, c in enumerate(commands) if " create -f -" in c]
        # The Job is the run's last object created (the namespace and its task maps come before).
        assert creates and watch < creates[-1], commands
        job_posts = [
            r for r in emulator.requests if r["method"] == "POST" and r["path"].endswith("/jobs")
        ]
        assert len(job_posts) == 1, job_posts
    finally:
        emulator.stop()
    job = load(output / "job.json")
    combined = [
        e
        for e in run.events
        if e["reason"] == "SuccessfulCreate"
        and e["message"].startswith("(combined from similar events): ")
    ]
    assert len(combined) == 1 and combined[0]["count"] == COUNT - 9, combined
    named = rl_batch_demo.pod_creation_events(rl_batch_demo.event_records(run.events))
    assert len(named) == 9, named
    errors = dict(
        zip((row["pod"] for row in run.rows), point_errors(run, job, run.rows)["pod_created"])
    )
    watched = []
    for row in run.rows:
        error, precision = errors[row["pod"]]
        assert abs(error) <= precision + (TRUTH_NOTED_AFTER if error < 0 else 0.0), (
            row,
            error,
            precision,
        )
        if row["pod"] in named:
            # Named by the event, unless the watch saw the pod before the controller named it, or the
            # event was named after the pod's creation second ended (a loaded machine): then that
            # second and the Job's creation bound it, narrower than the event's allowance still.
            assert named_creation_source(row["pod_created_source"]), row
            assert precision <= rl_batch_demo.EVENT_FOLLOWS_SECONDS + 1e-6, row
        else:
            # No event names it: placed by the watch that saw it created, after its Job's creation and
            # within its stamp's second (a loaded machine may deliver it after that second ended).
            assert "SuccessfulCreate" not in row["pod_created_source"], row
            watched.append((row["pod_created_source"], precision))
    print("precision of the pods past the recorder's tenth:", sorted(watched))
