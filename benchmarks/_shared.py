"""Constants shared by the driver and the child process (kept import-light)."""

RESULT_PREFIX = "BENCH_RESULT "
"""Prefix of the single stdout line carrying a child's JSON result."""
