"""Test files to pytest-xdist's workers heaviest first, from the seconds each file took in a recorded run.

``make test`` runs ``-n 2 --dist loadfile``: each test file goes whole to one worker, because most files start a
stack or a decoder per module. xdist hands the files out in the order of their test counts, which has little to
do with their cost here (test_bench_serve.py's three tests start three stacks and run 380-500 s;
test_rejection_sampler.py's 37 run 2 s), so a worker could start a 300 s file in the run's last minutes while the
other sat idle. Handing the longest remaining file to whichever worker asks next (longest processing time first)
ends both workers within about the last file's time of each other.

The seconds live in tests/durations.json, written from a run's ``--durations=0`` report::

    make test PYTEST_ARGS=--durations=0 > run.log
    python -m tests.scheduling run.log        # rewrites tests/durations.json

A file not in it (a new one) counts as its number of tests times the median seconds of a recorded test, so it
still goes out in a sensible place; stale seconds cost balance, never correctness.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).with_name("durations.json")
_LINE = re.compile(r"^\s*([0-9.]+)s\s+(setup|call|teardown)\s+([^:\s]+\.py)(?:::.*)?$")


def parse(report: str) -> tuple[dict[str, float], dict[str, int]]:
    """Each test file's seconds (setup, call and teardown of its tests) and tests (its call lines) in a
    ``--durations=0`` report."""
    seconds: dict[str, float] = defaultdict(float)
    tests: dict[str, int] = defaultdict(int)
    for line in report.splitlines():
        m = _LINE.match(line)
        if m:
            seconds[m.group(3)] += float(m.group(1))
            tests[m.group(3)] += m.group(2) == "call"
    return ({path: round(s, 1) for path, s in sorted(seconds.items())},
            {path: n for path, n in sorted(tests.items()) if n})


def file_seconds(report: str) -> dict[str, float]:
    """Each test file's seconds (setup, call and teardown of its tests) in a ``--durations=0`` report."""
    return parse(report)[0]


def load(path: Path = DURATIONS) -> dict[str, dict[str, float]]:
    """{"files": {path: seconds}, "tests": {path: tests in the recorded run}}; empty when there is no record."""
    if not path.exists():
        return {"files": {}, "tests": {}}
    return json.loads(path.read_text())


def make_scheduler(base: type, record: dict[str, dict[str, float]]):
    """A subclass of xdist's ``LoadFileScheduling`` (passed in: xdist is imported only where it runs) that gives
    out the heaviest remaining file each time a worker needs one; ``record`` is ``load()``'s."""
    per_test = statistics.median(s / max(record["tests"].get(f, 1), 1) for f, s in record["files"].items()) \
        if record["files"] else 1.0

    class HeaviestFirst(base):
        def _weight(self, scope: str) -> float:
            if scope in record["files"]:
                return record["files"][scope]
            return per_test * len(self.workqueue[scope])

        def _assign_work_unit(self, node) -> None:
            heaviest = max(self.workqueue, key=self._weight)
            self.workqueue.move_to_end(heaviest, last=False)  # the base class pops the queue's first unit
            super()._assign_work_unit(node)

    return HeaviestFirst


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tests.scheduling RUN_LOG  (a pytest run's output with --durations=0)",
              file=sys.stderr)
        return 2
    seconds, tests = parse(Path(argv[0]).read_text())
    if not seconds:
        print(f"{argv[0]}: no '--durations=0' lines found (run pytest with --durations=0)", file=sys.stderr)
        return 1
    DURATIONS.write_text(json.dumps({"files": seconds, "tests": tests}, indent=1) + "\n")
    print(f"wrote {DURATIONS}: {len(seconds)} files, {sum(seconds.values()):.0f} s of tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
