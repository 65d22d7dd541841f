"""Test tooling that the test suite and the benchmarks share: a multi-host test bed (``hosts``),
a throw-away PostgreSQL (``pgtemp``) and Ray cluster (``raycluster``), the dashboard's
screenshots (``screenshots``)."""
