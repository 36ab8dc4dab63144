"""``hypermedia user``: users and their API keys, written to the job record directly
(an operator's commands, on the server)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from hypermedia.cli.common import millicredits, note, open_engine, read_settings, say
from hypermedia.errors import ConfigError

app = typer.Typer(help="Users and their API keys.", no_args_is_help=True)

KeyPriority = Annotated[
    str | None,
    typer.Option(
        "--priority",
        envvar="HYPERMEDIA_GRANT_PRIORITY",
        help="Priorities the key may ask for, MIN-MAX or N (1 is the most urgent and goes"
        " to on-demand capacity; default: key_priority_min-key_priority_max).",
        show_default=False,
    ),
]
KeySubmits = Annotated[
    int | None,
    typer.Option(
        "--submits-per-minute",
        envvar="HYPERMEDIA_GRANT_SUBMITS_PER_MINUTE",
        min=0,
        help="Submits a minute the key may make, 0: no limit (default: key_submits_per_minute).",
        show_default=False,
    ),
]


def _grants(priority: str | None, submits_per_minute: int | None) -> Any:
    from hypermedia.accounts import KeyGrants

    low = high = None
    if priority is not None:
        first, _, last = priority.partition("-")
        if not first.strip().isdigit() or not (last or first).strip().isdigit():
            raise ConfigError("--priority (HYPERMEDIA_GRANT_PRIORITY)", "expected MIN-MAX or N")
        low, high = int(first), int(last or first)
    return KeyGrants(low, high, submits_per_minute)


@app.command("add")
def user_add(
    name: Annotated[str, typer.Argument(help="Unique user name.")],
    credits: Annotated[
        float, typer.Option("--credits", envvar="HYPERMEDIA_USER_CREDITS", min=0)
    ] = 0.0,
    operator: Annotated[
        bool, typer.Option("--operator", envvar="HYPERMEDIA_USER_OPERATOR", help="May see queues.")
    ] = False,
    pool: Annotated[
        str | None,
        typer.Option(
            "--pool",
            envvar="HYPERMEDIA_USER_POOL",
            help="Join this existing pool instead of getting a personal one.",
        ),
    ] = None,
    priority: KeyPriority = None,
    submits_per_minute: KeySubmits = None,
) -> None:
    """Create a user; prints the API key (on stdout, shown this once only)."""
    from hypermedia.accounts import create_user
    from hypermedia.db.engine import transaction

    engine = open_engine(read_settings())
    try:
        with transaction(engine) as conn:
            user = create_user(
                conn,
                name,
                time.time(),
                credits_millicredits=millicredits(credits),
                is_operator=operator,
                pool_id=pool,
                grants=_grants(priority, submits_per_minute),
            )
    finally:
        engine.dispose()
    role = " (operator)" if operator else ""
    note(f"created user {user.name}{role}: id {user.user_id}, pool {user.pool_id}")
    note(f"credits: {credits:g}")
    note("API key (shown only this once):")
    say(user.api_key)


@app.command("key")
def user_key(
    user: Annotated[str, typer.Argument(help="User name or id.")],
    label: Annotated[str, typer.Option("--label", envvar="HYPERMEDIA_KEY_LABEL")] = "",
    priority: KeyPriority = None,
    submits_per_minute: KeySubmits = None,
) -> None:
    """Issue another API key for a user; prints it (shown this once only)."""
    from hypermedia.accounts import create_api_key, find_user
    from hypermedia.db.engine import transaction

    grants = _grants(priority, submits_per_minute)
    engine = open_engine(read_settings())
    try:
        with transaction(engine) as conn:
            user_id = find_user(conn, user)
            key = create_api_key(conn, user_id, time.time(), name=label, grants=grants)
    finally:
        engine.dispose()
    note(f"new API key for {user} (shown only this once):")
    say(key)


@app.command("grant")
def user_grant(
    key: Annotated[str, typer.Argument(help="The key (hm_<key id>_...) or its key id.")],
    priority: KeyPriority = None,
    submits_per_minute: KeySubmits = None,
) -> None:
    """Set what an existing key may do; unset options return to the defaults. A running
    server applies it within its authentication cache time (30 s)."""
    from hypermedia.accounts import grant_api_key, key_id_of
    from hypermedia.db.engine import transaction

    grants = _grants(priority, submits_per_minute)
    engine = open_engine(read_settings())
    try:
        with transaction(engine) as conn:
            grant_api_key(conn, key_id_of(key), grants)
    finally:
        engine.dispose()
    say(f"API key {key_id_of(key)}: {_describe_grants(grants)}")


def _describe_grants(grants: Any) -> str:
    low, high = grants.priority_min, grants.priority_max
    shown = "default priorities" if low is None else f"priority {low}-{high}"
    rate = grants.submits_per_minute
    limit = "default submit rate" if rate is None else f"{rate or 'unlimited'} submits/min"
    return f"{shown}, {limit}"


@app.command("revoke")
def user_revoke(
    key: Annotated[str, typer.Argument(help="The key (hm_<key id>_...) or its key id.")],
) -> None:
    """Revoke an API key. A running server may accept it for up to 30 s more (its cache)."""
    from hypermedia.accounts import revoke_api_key
    from hypermedia.db.engine import transaction
    from hypermedia.errors import NotFound

    key_id = key.split("_")[1] if key.startswith("hm_") else key
    engine = open_engine(read_settings())
    try:
        with transaction(engine) as conn:
            revoked = revoke_api_key(conn, key_id, time.time())
    finally:
        engine.dispose()
    if not revoked:
        raise NotFound(f"no active API key {key_id!r}", key_id=key_id)
    say(f"revoked API key {key_id}")
