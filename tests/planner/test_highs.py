"""HiGHS's C-level prints never reach stdout in library use (issue 18): planner.highs."""

from __future__ import annotations

import ctypes
import os
import sys
import threading

import numpy as np
import pytest
from scipy.optimize import LinearConstraint

from planner.highs import quiet_milp, stdout_to_stderr


@pytest.mark.skipif(sys.platform == "win32", reason="C printf through ctypes needs a POSIX libc")
def test_c_printf_inside_goes_to_stderr_and_stdout_comes_back(capfd):
    libc = ctypes.CDLL(None)
    with stdout_to_stderr():
        # what HiGHS does: a printf from C, left in C's stdout buffer
        libc.printf(b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n")
        os.write(1, b"raw fd 1\n")
    os.write(1, b"after\n")
    out, err = capfd.readouterr()
    assert "HighsMipSolverData" in err and "raw fd 1" in err
    assert out == "after\n"


def test_nested_and_concurrent_blocks_restore_stdout(capfd):
    def solve():
        with stdout_to_stderr():
            with stdout_to_stderr():
                os.write(1, b"inner\n")

    threads = [threading.Thread(target=solve) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.write(1, b"still stdout\n")
    out, err = capfd.readouterr()
    assert out == "still stdout\n" and err.count("inner") == 4


def test_quiet_milp_solves_a_knapsack():
    # 0/1 knapsack, values 6, 10, 12, weights 1, 2, 3, capacity 5: best is items 2 and 3, value 22
    # (the textbook instance, e.g. Cormen et al., Introduction to Algorithms, exercise 16.2-2's example)
    res = quiet_milp(-np.array([6.0, 10.0, 12.0]), integrality=np.ones(3),
                     bounds=(0, 1), constraints=[LinearConstraint([[1.0, 2.0, 3.0]], -np.inf, 5.0)])
    assert res.status == 0 and np.allclose(res.x, [0, 1, 1]) and -res.fun == pytest.approx(22.0)
