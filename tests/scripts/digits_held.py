"""The digits workload held slow while a file exists: ``digits_held.py FILE ARGS`` runs
``python -m dyntrain.workloads.digits ARGS`` (the same arguments, the same math) with each chunk
taking ``holding.HELD_CHUNK_S`` more while FILE exists, so that a test can see capacity change
several times before the job ends, then release it.
"""

from __future__ import annotations

import sys

from holding import slowed

from dyntrain.workloads import digits

if __name__ == "__main__":
    digits.cross_entropy = slowed(digits.cross_entropy, sys.argv[1])
    digits.main(sys.argv[2:])
