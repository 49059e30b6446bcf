"""One RL rollout episode: fix the code -> run the tests -> reward.

Prints one JSON event per stdout line: "ready" once the task is written,
"reward" once the patched code has been tested.
"""
import time

import os
import sys

IMPORTS_DONE_AT = time.time()
EPISODE_ID = os.environ.get("EPISODE_ID", "")

BUGGY_SOURCE = """def shipping(total):
    if total > 99:
        return 0
    return 10
"""

TEST_SOURCE = """import unittest

from shipping import shipping


class ShippingTest(unittest.TestCase):
    def test_under_threshold_pays(self):
        self.assertEqual(shipping(98), 10)

    def test_threshold_ships_free(self):
        self.assertEqual(shipping(99), 0)

    def test_over_threshold_ships_free(self):
        self.assertEqual(shipping(100), 0)


if __name__ == "__main__":
    unittest.main()
"""


def flat_json(value):
    """JSON for a flat event of strings and numbers, without importing json before "ready"."""
    if isinstance(value, dict):
        return "{" + ", ".join(flat_json(k) + ": " + flat_json(v) for k, v in value.items()) + "}"
    if isinstance(value, str):
        return '"' + "".join(c if c.isalnum() or c in "-_.:/ " else "\\u%04x" % ord(c)
                             for c in value) + '"'
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)


def emit(event, **fields):
    record = {"event": event, "at": time.time(), "episode_id": EPISODE_ID}
    record.update(fields)
    json = sys.modules.get("json")
    sys.stdout.write((json.dumps(record) if json else flat_json(record)) + "\n")
    sys.stdout.flush()


def process_started_at():
    """Wall-clock start of this process from /proc (10 ms ticks), or None."""
    try:
        with open("/proc/self/stat") as stat_file:
            fields = stat_file.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as uptime_file:
            uptime = float(uptime_file.read().split()[0])
        now = time.time()
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return now - age
    except (OSError, ValueError, IndexError):
        return None


def write(path, text):
    with open(path, "w") as handle:
        handle.write(text)


def run_tests():
    # Imported after "ready" so that environment preparation stays lean.
    import subprocess

    return subprocess.run(
        [sys.executable, "-B", "test_shipping.py"],
        capture_output=True, text=True, timeout=20,
    )


def main():
    os.chdir("/workspace")
    write("shipping.py", BUGGY_SOURCE)
    write("test_shipping.py", TEST_SOURCE)
    started_at = process_started_at()
    ready_fields = {"imports_done_at": IMPORTS_DONE_AT,
                    "process_started_at": started_at,
                    "modules_before_ready": len(sys.modules)}
    if started_at is not None:
        ready_fields["import_seconds"] = IMPORTS_DONE_AT - started_at
    emit("ready", **ready_fields)

    import json  # noqa: F401  (the reward's free text needs real JSON escaping)

    baseline = run_tests()
    if baseline.returncode == 0:
        sys.exit("baseline must fail the boundary test")
    with open("shipping.py") as handle:
        source = handle.read()
    write("shipping.py", source.replace("total > 99", "total >= 99"))
    patched = run_tests()
    emit("reward", reward=1 if patched.returncode == 0 else 0,
         baseline_exit=baseline.returncode, tests_exit=patched.returncode,
         tests_output=patched.stderr)
    if patched.returncode != 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
