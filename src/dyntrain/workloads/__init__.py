"""Bundled real workloads that need no download."""
