"""``dyntrain lab``: measure the limits of data parallelism on your own workload."""

from __future__ import annotations

import click

from dyntrain.cli.lab_report import report
from dyntrain.cli.lab_sweep import sweep
from dyntrain.cli.lab_throughput import throughput


@click.group()
def lab() -> None:
    """Batch-size sweeps, the critical batch size, noise scale and scaling efficiency."""


lab.add_command(sweep)
lab.add_command(report)
lab.add_command(throughput)
