"""``dyntrain``: the command-line entry point; user errors become one line and an exit code.

Exit codes: 0 done; 1 the run or job failed (``compare``: the models differ); 2 bad input, or a
missing extra (``pip install 'dyntrain[EXTRA]'``); 3 the dyntrain service cannot be reached;
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import copy
import functools
import sys
from typing import NoReturn

import click

from dyntrain.cli.compare import compare
from dyntrain.cli.data import data
from dyntrain.cli.lab import lab
from dyntrain.cli.run import run, worker
from dyntrain.cli.service import COMMANDS as SERVICE_COMMANDS
from dyntrain.cli.sim import sim
from dyntrain.errors import EXIT_USAGE, DyntrainError
from dyntrain.extras import missing_extra
from dyntrain.mainexit import run_as_main

# words people type for a command that has another name here
SYNONYMS = {"list": "jobs", "ls": "jobs", "ps": "jobs", "job": "status", "show": "status",
            "describe": "status", "kill": "terminate", "stop": "terminate", "log": "logs",
            "tail": "logs", "start": "server", "serve": "server", "train": "run",
            "join": "worker", "queues": "queue", "jobdefs": "jobdef", "definitions": "jobdef",
            "ces": "ce", "environments": "ce", "diff": "compare", "pack": "data pack",
            "sweep": "lab sweep", "report": "lab report", "throughput": "lab throughput"}


class _Commands(click.Group):
    """The top-level group: a mistyped command is answered with the one a common synonym
    means (``kill``: ``terminate``), else with the closest name (click's own suggestion)."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = click.utils.make_str(args[0])
        meant = SYNONYMS.get(name.lower())
        if meant and self.get_command(ctx, name) is None:
            raise click.UsageError(f"No such command {name!r}. Did you mean {meant!r}?", ctx)
        return super().resolve_command(ctx, args)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dyntrain")
def cli() -> None:
    """Elastic data-parallel PyTorch training on capacity that comes and goes."""


cli.add_command(run)
cli.add_command(worker)
cli.add_command(compare)
cli.add_command(data)
cli.add_command(lab)
cli.add_command(sim)
for _command in SERVICE_COMMANDS:
    cli.add_command(_command)
# `dyntrain jobs`: the job table of `dyntrain status`, under the name people try first
_jobs = copy.copy(cli.commands["status"])
_jobs.help = _jobs.short_help = "List jobs (the table of `dyntrain status`; JOB: its details)."
cli.add_command(_jobs, name="jobs")


# the extra that brings everything a command group uses (a lab command that misses httpx needs
# the lab extra, not the service's)
_COMMAND_EXTRAS = {"lab": "lab", "sim": "lab"}


def _name_missing_extras(command: click.Command) -> None:
    """Every command of ``command``'s tree turns an import of a missing extra into one line
    naming the extra (``MissingExtra``), instead of an ImportError traceback."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _name_missing_extras(sub)
        return
    callback = command.callback

    @functools.wraps(callback)
    def wrapper(*args, **kwargs):
        try:
            return callback(*args, **kwargs)
        except ModuleNotFoundError as exc:
            path = click.get_current_context().command_path
            found = missing_extra(exc, f"`{path}`", _COMMAND_EXTRAS.get(path.split()[1]))
            if found is None:
                raise
            raise found from None

    command.callback = wrapper


_name_missing_extras(cli)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="dyntrain", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"dyntrain: error: {exc.format_message()}", err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        click.echo("dyntrain: aborted", err=True)
        sys.exit(130)
    except DyntrainError as exc:
        click.echo(f"dyntrain: error: {exc}", err=True)
        sys.exit(getattr(exc, "exit_code", EXIT_USAGE))


def entry() -> NoReturn:
    """The ``dyntrain`` command (and ``python -m dyntrain.cli.main``): ``main`` with the exit
    status Python would give, then the process ends without the interpreter's teardown of every
    module and object, which takes seconds of CPU once torch is imported
    (``dyntrain.mainexit``)."""
    run_as_main(main)


if __name__ == "__main__":
    entry()
