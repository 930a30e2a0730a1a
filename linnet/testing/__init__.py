"""Helpers for tests and benchmarks that need real external tools (a Triton server).

Nothing here is imported by `linnet` itself; the modules are importable so that bench/ can
reuse what tests/ uses.
"""
