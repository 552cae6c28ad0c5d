"""HiGHS's C-level prints never reach the terminal (issues 18 and 32): logged at debug level by planner.highs."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

import numpy as np
import pytest
from scipy.optimize import LinearConstraint

from planner.highs import quiet_milp, stdout_logged


@pytest.mark.skipif(sys.platform == "win32", reason="C printf through ctypes needs a POSIX libc")
def test_c_printf_inside_is_logged_at_debug_and_stdout_comes_back(capfd, caplog):
    libc = ctypes.CDLL(None)
    with caplog.at_level(logging.DEBUG, logger="planner.highs"):
        with stdout_logged():
            # what HiGHS does: a printf from C, left in C's stdout buffer
            libc.printf(b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n")
            os.write(1, b"raw fd 1\n")
        os.write(1, b"after\n")
    out, err = capfd.readouterr()
    assert out == "after\n" and err == ""  # neither stream of the terminal sees it
    logged = [r.getMessage() for r in caplog.records if r.name == "planner.highs" and r.levelno == logging.DEBUG]
    assert logged == ["HiGHS: HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();",
                      "HiGHS: raw fd 1"]


def test_nested_and_concurrent_blocks_restore_stdout(capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="planner.highs")

    def solve():
        with stdout_logged():
            with stdout_logged():
                os.write(1, b"inner\n")

    threads = [threading.Thread(target=solve) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.write(1, b"still stdout\n")
    out, err = capfd.readouterr()
    assert out == "still stdout\n" and "inner" not in err
    assert caplog.text.count("HiGHS: inner") == 4


def test_quiet_milp_solves_a_knapsack():
    # 0/1 knapsack, values 6, 10, 12, weights 1, 2, 3, capacity 5: best is items 2 and 3, value 22
    # (the textbook instance, e.g. Cormen et al., Introduction to Algorithms, exercise 16.2-2's example)
    res = quiet_milp(-np.array([6.0, 10.0, 12.0]), integrality=np.ones(3),
                     bounds=(0, 1), constraints=[LinearConstraint([[1.0, 2.0, 3.0]], -np.inf, 5.0)])
    assert res.status == 0 and np.allclose(res.x, [0, 1, 1]) and -res.fun == pytest.approx(22.0)
