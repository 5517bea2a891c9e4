"""Benchmarks of the community layer: run ``python bench/run.py`` (see BENCHMARKS.md)."""
