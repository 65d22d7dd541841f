"""The GPT workload held slow while a file exists: ``gpt_held.py FILE ARGS`` runs
``python -m dyntrain.workloads.gpt ARGS`` (the same arguments, the same math) with each chunk
taking 0.5 s more while FILE exists, and says at which sharding level its trainer steps
("gpt_held: sharded at level N", or "gpt_held: unsharded"), so that a test sees that the flags
reached every worker.

A service test holds a job in its slow phase until it has seen the membership changes it waits
for (a join, a leave, a crash), however slowly workers start on a loaded machine, then removes
FILE and lets the job finish at full speed. The sleep is outside the arithmetic: the trained
model is the one the workload makes without it.
"""

from __future__ import annotations

import sys

from holding import slowed

from dyntrain.workloads import gpt


def held(make_loss, hold: str):
    """``make_loss`` (gpt's ``next_byte_loss``) whose loss functions sleep while ``hold``
    exists."""
    def make(*args, **kwargs):
        return slowed(make_loss(*args, **kwargs), hold)

    return make


def telling(build):
    """gpt's ``build`` that prints the sharding level of the trainer it built."""
    def make(args):
        trainer = build(args)
        level = int(trainer.sharding.level)
        print(f"gpt_held: sharded at level {level}" if level else "gpt_held: unsharded",
              flush=True)
        return trainer

    return make


if __name__ == "__main__":
    gpt.next_byte_loss = held(gpt.next_byte_loss, sys.argv[1])
    gpt.build = telling(gpt.build)
    gpt.main(sys.argv[2:])
