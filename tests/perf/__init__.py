"""Benchmarks (`python -m tests.perf.<name>`); each writes its figures as JSON under tests/perf/results/."""
