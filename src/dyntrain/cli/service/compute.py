"""``dyntrain ce``: compute environments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from dyntrain.cli.service.common import (
    CAPACITY_TYPES,
    STATES,
    conn_options,
    friendly,
    from_file,
    load_body,
    make_client,
    parse_slots,
    remember_conn,
    resources_fields,
)
from dyntrain.cli.service.output import list_items, make_console, make_table, print_record


@click.group("ce")
@conn_options
@click.pass_context
def ce(ctx, url, token):
    """Compute environments: pools of worker slots."""
    remember_conn(ctx, url, token)


def _ce_table(envs: list[dict[str, Any]]):
    table = make_table("NAME", "TYPE", "PRICE/SLOT-H", "SLOT", "MIN:DESIRED:MAX", "AVAILABLE",
                       "IN USE", "STATE", "STATUS")
    for env in envs:
        slot = env.get("slot") or {}
        status = str(env.get("status") or "")
        if env.get("status_reason"):
            status += f" ({env['status_reason']})"
        table.add_row(
            str(env.get("name", "")), str(env.get("capacity_type", "")),
            f"{float(env.get('price_per_slot_hour') or 0):.4g}",
            f"{slot.get('cpus', '?')} cpu, {slot.get('gpus', 0)} gpu, "
            f"{slot.get('memory_mib', '?')} MiB",
            f"{env.get('min_slots')}:{env.get('desired_slots')}:{env.get('max_slots')}",
            f"{env.get('available_slots', '-')}{' (trace)' if env.get('trace') else ''}",
            str(env.get("slots_in_use", "-")), str(env.get("state", "")), status)
    return table


@ce.command("create")
@click.argument("name", required=False)
@click.option("-f", "--file", "path", default=None, metavar="FILE.yaml",
              help="Fields of the environment (flags override them).")
@click.option("--type", "capacity_type", default=None,
              type=click.Choice(CAPACITY_TYPES, case_sensitive=False),
              help="Capacity type [default: ON_DEMAND].")
@click.option("--price", type=float, default=None, help="Price per slot-hour.")
@click.option("--slots", default=None, metavar="MIN:DESIRED:MAX", help="Slot counts.")
@click.option("--slot-cpus", type=float, default=None, help="CPUs of one slot.")
@click.option("--slot-gpus", type=int, default=None, help="GPUs of one slot.")
@click.option("--slot-memory", type=int, default=None, metavar="MiB", help="Memory of one slot.")
@click.option("--state", default=None, type=click.Choice(STATES, case_sensitive=False))
@conn_options
@friendly
def ce_create(name, path, capacity_type, price, slots, slot_cpus, slot_gpus, slot_memory, state,
              url, token):
    """Create compute environment NAME from flags or -f FILE.yaml."""
    body = load_body(path, "ComputeEnvironmentIn") if path else {}
    if name:
        body["name"] = name
    if not body.get("name"):
        raise click.UsageError("ce create needs a NAME (or a name in -f FILE)")
    if capacity_type:
        body["capacity_type"] = capacity_type.upper()
    if price is not None:
        body["price_per_slot_hour"] = price
    if slots is not None:
        body["min_slots"], body["desired_slots"], body["max_slots"] = parse_slots(slots)
    slot = resources_fields(slot_cpus, slot_gpus, slot_memory)
    if slot:
        base = body.get("slot") if isinstance(body.get("slot"), dict) else {}
        body["slot"] = {**base, **slot}
    if state:
        body["state"] = state.upper()
    client = make_client(url, token)
    env = from_file(path, lambda: client.create_compute_environment(**body))
    click.echo(f"created compute environment {env.get('name', body['name'])}"
               if isinstance(env, dict) else f"created compute environment {body['name']}")
    _say_machine_note(env)


@ce.command("list")
@conn_options
@friendly
def ce_list(url, token):
    """List compute environments."""
    envs = list_items(make_client(url, token).list_compute_environments(), "compute_environments",
                      "items")
    make_console().print(_ce_table(envs) if envs else "no compute environments")


@ce.command("show")
@click.argument("name")
@conn_options
@friendly
def ce_show(name, url, token):
    """Show compute environment NAME."""
    print_record(make_client(url, token).get_compute_environment(name),
                 ("name", "capacity_type", "price_per_slot_hour", "slot", "min_slots",
                  "desired_slots", "max_slots", "state", "status", "status_reason"))


@ce.command("update")
@click.argument("name")
@click.option("--min", "min_slots", type=int, default=None, help="Minimum slots.")
@click.option("--desired", type=int, default=None, help="Desired slots.")
@click.option("--max", "max_slots", type=int, default=None, help="Maximum slots.")
@click.option("--state", default=None, type=click.Choice(STATES, case_sensitive=False))
@click.option("--price", type=float, default=None, help="Price per slot-hour.")
@conn_options
@friendly
def ce_update(name, min_slots, desired, max_slots, state, price, url, token):
    """Change compute environment NAME's capacity, state or price (takes effect now)."""
    fields: dict[str, Any] = {}
    if min_slots is not None:
        fields["min_slots"] = min_slots
    if desired is not None:
        fields["desired_slots"] = desired
    if max_slots is not None:
        fields["max_slots"] = max_slots
    if state:
        fields["state"] = state.upper()
    if price is not None:
        fields["price_per_slot_hour"] = price
    if not fields:
        raise click.UsageError("ce update needs at least one of --min, --desired, --max, "
                               "--state, --price")
    env = make_client(url, token).update_compute_environment(name, **fields)
    click.echo(f"updated compute environment {name}")
    _say_machine_note(env)


def _say_machine_note(env: Any) -> None:
    """How many of its slots the service's one machine holds, when that is fewer."""
    if isinstance(env, dict) and env.get("machine_note"):
        click.echo(f"note: {env['machine_note']}")


@ce.command("delete")
@click.argument("name")
@conn_options
@friendly
def ce_delete(name, url, token):
    """Delete compute environment NAME (no queue may use it)."""
    make_client(url, token).delete_compute_environment(name)
    click.echo(f"deleted compute environment {name}")


@ce.command("trace")
@click.argument("name")
@click.argument("csv_file", required=False, metavar="FILE.csv")
@click.option("--loop", is_flag=True, help="Repeat the trace when it ends.")
@click.option("--clear", is_flag=True, help="Stop replaying a trace.")
@conn_options
@friendly
def ce_trace(name, csv_file, loop, clear, url, token):
    """Replay FILE.csv as NAME's capacity from now (offset_s,slots[,price]), or --clear it."""
    from dyntrain.service.core.capacity import load_trace

    if clear:
        if csv_file or loop:
            raise click.UsageError("ce trace --clear takes no FILE and no --loop")
        make_client(url, token).clear_capacity_trace(name)
        click.echo(f"cleared the capacity trace of {name}")
        return
    if not csv_file:
        raise click.UsageError("ce trace needs a FILE.csv (or --clear)")
    trace = load_trace(csv_file, loop=loop)  # errors name the file and line
    text = Path(csv_file).read_text()
    client = make_client(url, token)
    from_file(csv_file, lambda: client.set_capacity_trace(name, text, loop=loop))
    click.echo(f"replaying {csv_file} on {name}: {len(trace.rows)} rows over "
               f"{trace.duration:g} s{' (looping)' if loop else ''}")
