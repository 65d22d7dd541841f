"""A loss held slow while a file exists, for the ``*_held.py`` workload wrappers.

A test holds a job in its slow phase until it has seen the membership changes it waits for (a
join, a leave, a crash), however slowly workers start on a loaded machine, then removes the file
and lets the job finish at full speed. The sleep is outside the arithmetic: the trained model is
the one the workload makes without it.
"""

from __future__ import annotations

import os
import time

HELD_CHUNK_S = 0.5


def slowed(loss_fn, hold: str):
    """``loss_fn`` that sleeps ``HELD_CHUNK_S`` before each chunk while ``hold`` exists."""
    def held_loss(model, batch):
        if os.path.exists(hold):
            time.sleep(HELD_CHUNK_S)
        return loss_fn(model, batch)

    return held_loss
