"""One configuration of ``bench/numerics_cost.py``: a workload module run alone, as a job's worker.

    python bench/numerics_cost_worker.py MODULE [ARGS...]

The environment carries the configuration: ``OMP_NUM_THREADS`` and the kernel-level variables
are read by the libraries when torch loads; where the ``DYNTRAIN_*`` numerics variables are set
(a pinned configuration), what can be set at run time (threads, deterministic algorithms,
matmul precision) is applied here as a job's worker applies it, then ``MODULE`` runs as
``__main__`` with ``ARGS``. Without them (the host's own choice) nothing is applied.
"""

from __future__ import annotations

import runpy
import sys

from dyntrain.elastic.numerics import apply, numerics_from_env


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: numerics_cost_worker.py MODULE [ARGS...]")
    numerics = numerics_from_env()
    if numerics is not None:
        apply(numerics)
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
