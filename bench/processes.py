"""The benchmarks' name for the shared process helpers (support/processes.py)."""

from support.processes import Child, Children, free_port, wait_until

__all__ = ["Child", "Children", "free_port", "wait_until"]
