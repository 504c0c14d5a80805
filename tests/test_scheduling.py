"""tests/scheduling.py: xdist's workers take the heaviest remaining test file first, by a recorded run's seconds."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.scheduling import file_seconds, main

REPO = Path(__file__).resolve().parents[1]

REPORT = """\
============================= slowest durations ==============================
202.75s call     tests/e2e/test_bench_serve.py::test_a
65.68s setup    tests/e2e/test_services.py::test_b[split]
1.50s teardown tests/e2e/test_services.py::test_b[split]
3.25s call     tests/e2e/test_services.py::test_c
0.01s call     tests/test_docs.py::test_readme[make demo]
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
992 passed in 3125.27s (0:52:05)
"""


def test_a_durations_report_sums_setup_call_and_teardown_per_file():
    assert file_seconds(REPORT) == {"tests/e2e/test_bench_serve.py": 202.8, "tests/e2e/test_services.py": 70.4,
                                    "tests/test_docs.py": 0.0}


def test_main_names_what_it_needs_when_the_log_has_no_durations(tmp_path, capsys):
    log = tmp_path / "run.log"
    log.write_text("992 passed in 3125.27s\n")
    assert main([str(log)]) == 1
    assert "--durations=0" in capsys.readouterr().err


def test_one_worker_runs_the_files_heaviest_first(tmp_path):
    """A real xdist run (one worker, so the order it runs files in is the order they were handed out): recorded
    seconds put b (50 s) before c (10 s) before a (1 s); d, unrecorded, weighs its 4 tests at the median recorded
    seconds a test (10 s): 40 s, between b and c."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        import pytest

        @pytest.hookimpl(optionalhook=True)
        def pytest_xdist_make_scheduler(config, log):
            from xdist.scheduler import LoadFileScheduling
            from tests.scheduling import make_scheduler
            record = {json.dumps({"files": {"test_a.py": 1, "test_b.py": 50, "test_c.py": 10},
                                  "tests": {"test_a.py": 1, "test_b.py": 1, "test_c.py": 1}})}
            return make_scheduler(LoadFileScheduling, record)(config, log)
        """))
    for name, tests in (("a", 1), ("b", 1), ("c", 1), ("d", 4)):
        (tmp_path / f"test_{name}.py").write_text("".join(
            f"def test_{i}():\n    open('order.txt', 'a').write('{name}')\n\n" for i in range(tests)))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1",
                          "--dist", "loadfile", "--rootdir", str(tmp_path), str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "order.txt").read_text() == "bddddca"
