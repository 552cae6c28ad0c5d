"""One module's ops: which ops share a decision (groups), and the exact save/recompute trade-off.

``groups``: the SAC conventions tie ops into groups; ``frontier``: every
non-dominated (saved bytes, saved ms) decision of a module; ``knapsack``: the
same decision as a small integer program, for modules too large to list;
``policy``: the op-level policy for one module and one memory fraction.
"""
