"""bench/pyspy_shares.py: a thread's busy samples inside given frames, from py-spy's raw stacks."""

from __future__ import annotations

from bench.pyspy_shares import shares

RAW = """thread (1): MainThread;core_main (core.py:189);_ConnectionBase.poll (multiprocessing/connection.py:257) 50
thread (1): MainThread;core_main (core.py:195);RoundSampling.load (graph_sampling.py:97);fill (coins.py:46) 3
thread (1): MainThread;core_main (core.py:195);RoundSampling.load (graph_sampling.py:91) 1
thread (1): MainThread;core_main (core.py:195);send (core.py:61) 4
thread (2): parent-watch;watch (core.py:222) 99
"""


def test_shares_count_busy_samples_of_one_thread_by_frame_prefix(tmp_path):
    path = tmp_path / "raw.txt"
    path.write_text(RAW)
    got = shares(str(path), ["RoundSampling.load (", "RoundSampling.load (graph_sampling.py:97)", "send (", "watch ("])
    assert got["busy_samples"] == 8  # the idle poll and the other thread left out
    assert got["shares_pct"] == {"RoundSampling.load (": 50.0, "RoundSampling.load (graph_sampling.py:97)": 37.5,
                                 "send (": 50.0, "watch (": 0.0}
