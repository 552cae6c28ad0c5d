"""Bounds on the recompute a plan still has to pay: what lets the list searches prune without losing exactness.

``lagrange``: an affine bound from the duals of the hull LP; ``cost_to_go``:
the DP run backward on a coarse grid of discarded memory.
"""
