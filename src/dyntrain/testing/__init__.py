"""Test tooling that the test suite and the benchmarks share (``hosts``: a multi-host test bed)."""
