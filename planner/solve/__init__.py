"""The module-level problem and its engines: which modules to checkpoint, at which frontier point.

``problem``: the model every engine reads (candidates, frontiers, needs);
``solution``: what an engine answers. The engines: ``dp`` (the default, an
exact bounded DP, searching with ``dp_search``), ``milp`` (HiGHS through
``scipy.optimize.milp``: fallback and cross-check) and ``min_peak`` (the
smallest feasible peak). Their bounds live in ``bounds/``, the relaxations for
stacks of identical blocks in ``stack/``; ``giants`` lists the usable part of
frontiers too long to list whole, ``points`` and ``trace`` are shared tools.
"""
