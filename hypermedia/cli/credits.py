"""``hypermedia credits``: credit accounts. ``grant`` writes the job record and
``check`` reads it (an operator, on the server); ``show`` asks the API with the
caller's key."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

from hypermedia.cli.common import (
    ApiKey,
    ApiUrl,
    Timeout,
    millicredits,
    open_client,
    open_engine,
    read_settings,
    say,
)

app = typer.Typer(help="Credit accounts.", no_args_is_help=True)


@app.command("grant")
def credits_grant(
    user: Annotated[str, typer.Argument(help="User name or id.")],
    amount: Annotated[float, typer.Argument(help="Credits to add (negative: remove; use --).")],
    note: Annotated[str, typer.Option("--note", envvar="HYPERMEDIA_CREDITS_NOTE")] = "",
) -> None:
    """Add credits to a user's account."""
    from hypermedia.accounts import find_user, grant_credits
    from hypermedia.db.engine import transaction

    engine = open_engine(read_settings())
    try:
        with transaction(engine) as conn:
            user_id = find_user(conn, user)
            balance = grant_credits(conn, user_id, millicredits(amount), time.time(), note=note)
    finally:
        engine.dispose()
    say(f"granted {amount:g} credits to {user}; balance {balance / 1000:g}")


@app.command("check")
def credits_check(
    as_json: Annotated[
        bool, typer.Option("--json", envvar="HYPERMEDIA_CREDITS_JSON", help="JSON out.")
    ] = False,
) -> None:
    """Check every credit account against its ledger and its jobs: the balance is the
    sum of the ledger's entries, the reservation what unfinished jobs hold, neither
    below zero, no job charged twice. Exits 1 naming each account that disagrees."""
    from sqlalchemy import select

    from hypermedia.db import tables as t
    from hypermedia.db.engine import snapshot, unlimited
    from hypermedia.jobs.credits import drift

    engine = open_engine(read_settings())
    try:
        # One statement over every account's ledger and jobs: as long as the ledger is.
        with snapshot(engine) as conn, unlimited(conn):
            found = drift(conn)
            names = dict(
                conn.execute(
                    select(t.users.c.user_id, t.users.c.name).where(
                        t.users.c.user_id.in_([d.user_id for d in found])
                    )
                ).all()
            )
    finally:
        engine.dispose()
    if as_json:
        say(
            json.dumps(
                [
                    {
                        "user_id": d.user_id,
                        "name": names.get(d.user_id),
                        "balance_millicredits": d.balance,
                        "ledger_millicredits": d.ledger,
                        "reserved_millicredits": d.reserved,
                        "held_millicredits": d.held,
                        "double_charged": list(d.double_charged),
                        "problems": d.problems,
                    }
                    for d in found
                ]
            )
        )
    elif not found:
        say("every credit account agrees with its ledger and its jobs")
    for d in found if not as_json else ():
        say(f"{names.get(d.user_id, d.user_id)} ({d.user_id}): {'; '.join(d.problems)}")
    if found:
        raise typer.Exit(1)


@app.command("show")
def credits_show(
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    timeout: Timeout = 30.0,
) -> None:
    """Your balance, what unfinished jobs hold, and what is available."""
    with open_client(api_url, api_key, timeout) as client:
        account = client.credits()
    say(
        f"balance {account.balance:g}, reserved {account.reserved:g}, "
        f"available {account.available:g}"
    )
