"""Benchmarks: each prints a table for people and ends with one JSON line for scripts."""
