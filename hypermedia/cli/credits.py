"""``hypermedia credits``: credit accounts. ``grant`` writes the job record (an
operator, on the server); ``show`` asks the API with the caller's key."""

from __future__ import annotations

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
    typer.echo(f"granted {amount:g} credits to {user}; balance {balance / 1000:g}")


@app.command("show")
def credits_show(
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    timeout: Timeout = 30.0,
) -> None:
    """Your balance, what unfinished jobs hold, and what is available."""
    with open_client(api_url, api_key, timeout) as client:
        account = client.credits()
    typer.echo(
        f"balance {account.balance:g}, reserved {account.reserved:g}, "
        f"available {account.available:g}"
    )
