"""Benchmarks runnable from an installed package (`kvpool bench ...`); bench/*.py are thin wrappers."""
