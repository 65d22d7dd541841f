"""``dyntrain policy``: fair-share scheduling policies (AWS Batch's), which queues name."""

from __future__ import annotations

from urllib.parse import quote

import click

from dyntrain.cli.service.common import conn_options, friendly, make_client, remember_conn
from dyntrain.cli.service.output import make_console, make_table


@click.group("policy")
@conn_options
@click.pass_context
def policy(ctx, url, token):
    """Fair-share scheduling policies: shares of a queue by weight."""
    remember_conn(ctx, url, token)


def _shares(values: tuple[str, ...]) -> list[dict]:
    out = []
    for value in values:
        share, _, factor = value.partition("=")
        try:
            out.append({"identifier": share, "weight_factor": float(factor) if factor else 1.0})
        except ValueError:
            raise click.BadParameter(f"{value!r}: expected SHARE=WEIGHT_FACTOR",
                                     param_hint="--share") from None
    return out


@policy.command("create")
@click.argument("name")
@click.option("--share", "shares", multiple=True, metavar="ID[*]=FACTOR",
              help="A share and its weight factor (lower gets more; 1 by default); a trailing "
                   "* makes ID a prefix. Repeatable.")
@click.option("--decay", type=int, default=0, show_default=True, metavar="S",
              help="shareDecaySeconds: the window usage fades over (0: 600 s).")
@click.option("--reserve", type=int, default=0, show_default=True, metavar="PCT",
              help="computeReservation (0-99): slots kept for shares not active yet.")
@conn_options
@friendly
def policy_create(name, shares, decay, reserve, url, token):
    """Create scheduling policy NAME."""
    make_client(url, token).request("POST", "/scheduling-policies", json={
        "name": name, "share_decay_seconds": decay, "compute_reservation": reserve,
        "shares": _shares(shares)})
    click.echo(f"created scheduling policy {name}")


@policy.command("list")
@conn_options
@friendly
def policy_list(url, token):
    """List scheduling policies."""
    policies = make_client(url, token).request("GET", "/scheduling-policies")
    if not policies:
        make_console().print("no scheduling policies")
        return
    table = make_table("NAME", "SHARES (WEIGHT FACTOR)", "DECAY S", "RESERVE %")
    for p in policies:
        table.add_row(p["name"], ", ".join(f"{s['identifier']}={s['weight_factor']:g}"
                                           for s in p["shares"]) or "-",
                      str(p["share_decay_seconds"]), str(p["compute_reservation"]))
    make_console().print(table)


@policy.command("delete")
@click.argument("name")
@conn_options
@friendly
def policy_delete(name, url, token):
    """Delete scheduling policy NAME (no queue may use it)."""
    make_client(url, token).request("DELETE", f"/scheduling-policies/{quote(name, safe='')}")
    click.echo(f"deleted scheduling policy {name}")
