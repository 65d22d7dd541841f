"""Test tooling that the test suite and the benchmarks share: the one way to wait on a condition
(``wait``), a multi-host test bed (``hosts``), a throw-away PostgreSQL (``pgtemp``) and Ray
cluster (``raycluster``), the dashboard's screenshots (``screenshots``)."""
