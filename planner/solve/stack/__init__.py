"""Stacks of identical blocks (most deep models): exact relaxations in count space, and plans from them.

``relaxation``: the count-space relaxation of a stack and its plans;
``ordered``: the relaxation that keeps every block's own constraints (tight
budgets); ``tail``: what the model after the blocks needs from them;
``multiset``: the exact knapsack over n copies of one frontier both rely on.
"""
