"""The stats format: what a collector measured about one training step.

``format``: stats v1 (pydantic models and their validation), the hallway
between the collector, the planner and the service; ``torch_format``:
PyTorch's ``module_info`` + ``sac_stats`` converted to v1; ``loader``: reading
and validating a document in either format.
"""
