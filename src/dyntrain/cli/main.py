"""``dyntrain``: the command-line entry point; user errors become one line and exit code 2."""

from __future__ import annotations

import sys

import click

from dyntrain.cli.compare import compare
from dyntrain.cli.data import data
from dyntrain.cli.lab import lab
from dyntrain.cli.run import run, worker
from dyntrain.cli.service import COMMANDS as SERVICE_COMMANDS
from dyntrain.errors import DyntrainError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dyntrain")
def cli() -> None:
    """Elastic data-parallel PyTorch training on capacity that comes and goes."""


cli.add_command(run)
cli.add_command(worker)
cli.add_command(compare)
cli.add_command(data)
cli.add_command(lab)
for _command in SERVICE_COMMANDS:
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="dyntrain", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"dyntrain: error: {exc.format_message()}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("dyntrain: aborted", err=True)
        sys.exit(130)
    except DyntrainError as exc:
        click.echo(f"dyntrain: error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
