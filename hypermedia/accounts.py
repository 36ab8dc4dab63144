"""Users, pools, API keys and credit accounts.

API keys look like ``hm_<key_id>_<secret>``. Only ``sha256(secret)`` is stored;
the key is shown once, when created. Authentication looks the row up by key id
and compares digests in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, bindparam, exists, insert, select, true, update

from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.errors import AuthenticationFailed, Conflict, InvalidRequest, NotFound
from hypermedia.ids import new_id

KEY_PREFIX = "hm"


@dataclass(frozen=True, slots=True)
class KeyGrants:
    """What the operator granted one API key; None: the settings' default for keys
    (``key_priority_min``, ``key_priority_max``, ``key_submits_per_minute``).
    ``submits_per_minute=0`` means no limit."""

    priority_min: int | None = None
    priority_max: int | None = None
    submits_per_minute: int | None = None

    def __post_init__(self) -> None:
        for value in (self.priority_min, self.priority_max):
            if value is not None and not 1 <= value <= 10:
                raise InvalidRequest(f"priorities run from 1 to 10, not {value}")
        if (
            self.priority_min is not None
            and self.priority_max is not None
            and self.priority_min > self.priority_max
        ):
            raise InvalidRequest(f"priority range {self.priority_min}-{self.priority_max} is empty")
        if self.submits_per_minute is not None and self.submits_per_minute < 0:
            raise InvalidRequest("submits_per_minute must be 0 (no limit) or more")

    def resolved(self, defaults: KeyGrants) -> KeyGrants:
        """These grants with what is unset taken from ``defaults``."""
        return KeyGrants(
            self.priority_min if self.priority_min is not None else defaults.priority_min,
            self.priority_max if self.priority_max is not None else defaults.priority_max,
            self.submits_per_minute
            if self.submits_per_minute is not None
            else defaults.submits_per_minute,
        )


UNLIMITED = KeyGrants(priority_min=1, priority_max=10, submits_per_minute=0)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the identity every access check uses, and what their API key
    may do (``key_id`` is None for a caller built in-process, without a key)."""

    user_id: str
    is_operator: bool = False
    key_id: str | None = None
    grants: KeyGrants = KeyGrants()


@dataclass(frozen=True, slots=True)
class NewUser:
    user_id: str
    name: str
    api_key: str
    pool_id: str


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_user(
    conn: Connection,
    name: str,
    now: float,
    *,
    credits_millicredits: int = 0,
    is_operator: bool = False,
    pool_id: str | None = None,
    grants: KeyGrants | None = None,
) -> NewUser:
    """A user with a credit account, an API key and membership of a pool (their own
    personal pool unless ``pool_id`` names an existing one)."""
    exists = conn.execute(select(t.users.c.user_id).where(t.users.c.name == name)).first()
    if exists is not None:
        raise Conflict(f"a user named {name!r} already exists", name=name)
    user_id = new_id()
    moment = to_datetime(now)
    conn.execute(
        insert(t.users).values(
            user_id=user_id, name=name, is_operator=is_operator, created_at=moment
        )
    )
    if pool_id is None:
        pool_id = personal_pool_id(user_id)
        create_pool(conn, pool_id, f"{name}'s files", now)
    add_pool_member(conn, pool_id, user_id)
    conn.execute(
        insert(t.credit_accounts).values(
            user_id=user_id,
            balance_millicredits=0,
            reserved_millicredits=0,
            updated_at=moment,
        )
    )
    if credits_millicredits:
        grant_credits(conn, user_id, credits_millicredits, now, note="initial grant")
    api_key = create_api_key(conn, user_id, now, name="default", grants=grants)
    return NewUser(user_id=user_id, name=name, api_key=api_key, pool_id=pool_id)


def personal_pool_id(user_id: str) -> str:
    """The pool ``create_user`` makes for a user who joins no existing pool."""
    return f"user-{user_id}"


# Built once, as the two below: every upload runs them.
_POOLS_OF = (
    select(t.pool_members.c.pool_id)
    .where(t.pool_members.c.user_id == bindparam("m_user", type_=t.pool_members.c.user_id.type))
    .order_by(t.pool_members.c.pool_id)
)


def default_pool_id(conn: Connection, user_id: str) -> str:
    """Where a user's uploads go unless they name a pool: their personal pool, else
    the first pool they belong to; NotFound if they belong to none."""
    pools = conn.execute(_POOLS_OF, {"m_user": user_id}).scalars().all()
    personal = personal_pool_id(user_id)
    if personal in pools:
        return personal
    if not pools:
        raise NotFound(f"user {user_id!r} belongs to no pool", user_id=user_id)
    return str(pools[0])


def find_user(conn: Connection, name_or_id: str) -> str:
    """The user id of the user with this name (or id); NotFound otherwise."""
    row = conn.execute(
        select(t.users.c.user_id).where(
            (t.users.c.name == name_or_id) | (t.users.c.user_id == name_or_id)
        )
    ).first()
    if row is None:
        raise NotFound(f"no user {name_or_id!r}", user=name_or_id)
    return str(row.user_id)


def create_pool(conn: Connection, pool_id: str, name: str, now: float) -> None:
    conn.execute(insert(t.pools).values(pool_id=pool_id, name=name, created_at=to_datetime(now)))


def add_pool_member(conn: Connection, pool_id: str, user_id: str, role: str = "member") -> None:
    if conn.execute(select(t.pools.c.pool_id).where(t.pools.c.pool_id == pool_id)).first() is None:
        raise NotFound(f"no pool {pool_id!r}", pool_id=pool_id)
    conn.execute(insert(t.pool_members).values(pool_id=pool_id, user_id=user_id, role=role))


_POOL_MEMBER = select(t.pool_members.c.user_id).where(
    t.pool_members.c.pool_id == bindparam("m_pool", type_=t.pool_members.c.pool_id.type),
    t.pool_members.c.user_id == bindparam("m_user", type_=t.pool_members.c.user_id.type),
)


def is_pool_member(conn: Connection, pool_id: str, user_id: str) -> bool:
    row = conn.execute(_POOL_MEMBER, {"m_pool": pool_id, "m_user": user_id}).first()
    return row is not None


def create_api_key(
    conn: Connection,
    user_id: str,
    now: float,
    name: str = "",
    grants: KeyGrants | None = None,
) -> str:
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(24)
    granted = grants or KeyGrants()
    conn.execute(
        insert(t.api_keys).values(
            key_id=key_id,
            user_id=user_id,
            key_hash=_digest(secret),
            name=name,
            created_at=to_datetime(now),
            priority_min=granted.priority_min,
            priority_max=granted.priority_max,
            submits_per_minute=granted.submits_per_minute,
        )
    )
    return f"{KEY_PREFIX}_{key_id}_{secret}"


def key_id_of(api_key: str) -> str:
    """The key id of ``hm_<key id>_<secret>``, or the argument if it is a bare id."""
    return api_key.split("_")[1] if api_key.startswith(f"{KEY_PREFIX}_") else api_key


def grant_api_key(conn: Connection, key_id: str, grants: KeyGrants) -> None:
    """Replace what an active key may do (a running server sees it within its
    authentication cache time)."""
    result = conn.execute(
        update(t.api_keys)
        .where(t.api_keys.c.key_id == key_id, t.api_keys.c.revoked_at.is_(None))
        .values(
            priority_min=grants.priority_min,
            priority_max=grants.priority_max,
            submits_per_minute=grants.submits_per_minute,
        )
    )
    if result.rowcount != 1:
        raise NotFound(f"no active API key {key_id!r}", key_id=key_id)


def revoke_api_key(conn: Connection, key_id: str, now: float) -> bool:
    result = conn.execute(
        update(t.api_keys)
        .where(t.api_keys.c.key_id == key_id, t.api_keys.c.revoked_at.is_(None))
        .values(revoked_at=to_datetime(now))
    )
    return result.rowcount == 1


def key_in_force(caller: Caller) -> ColumnElement[bool]:
    """SQL: the caller's API key is still theirs and not revoked (always true for a
    caller built in-process, without a key). What a long request (a job's event stream)
    asks again as it goes: authentication was checked once, when it began."""
    if caller.key_id is None:
        return true()
    k = t.api_keys.c
    return exists().where(
        k.key_id == caller.key_id, k.user_id == caller.user_id, k.revoked_at.is_(None)
    )


def authenticate(conn: Connection, api_key: str) -> Caller:
    """The caller behind a key, or AuthenticationFailed (same answer for every bad key)."""
    parts = api_key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX:
        raise AuthenticationFailed("invalid API key")
    _, key_id, secret = parts
    k = t.api_keys.c
    row = conn.execute(
        select(
            k.key_hash,
            k.revoked_at,
            k.priority_min,
            k.priority_max,
            k.submits_per_minute,
            t.users.c.user_id,
            t.users.c.is_operator,
        )
        .join(t.users, t.users.c.user_id == k.user_id)
        .where(k.key_id == key_id)
    ).first()
    # Compare even when the row is missing so timing does not reveal valid key ids.
    expected = row.key_hash if row is not None else _digest("")
    if not hmac.compare_digest(expected, _digest(secret)) or row is None or row.revoked_at:
        raise AuthenticationFailed("invalid API key")
    return Caller(
        user_id=row.user_id,
        is_operator=bool(row.is_operator),
        key_id=key_id,
        grants=KeyGrants(row.priority_min, row.priority_max, row.submits_per_minute),
    )


def grant_credits(
    conn: Connection, user_id: str, amount_millicredits: int, now: float, note: str = ""
) -> int:
    """Add (or, negative, remove) credits; returns the new balance.

    A removal takes at most what is available (``balance - reserved``): what unfinished
    jobs hold stays, so their charges never take the balance below zero. More raises
    :class:`Conflict`, nothing removed. The guard is in the UPDATE itself, so a removal
    and a submit's reservation racing on the account row are one after the other."""
    acct = t.credit_accounts
    stmt = update(acct).where(acct.c.user_id == user_id)
    if amount_millicredits < 0:
        stmt = stmt.where(
            acct.c.balance_millicredits + amount_millicredits >= acct.c.reserved_millicredits
        )
    result = conn.execute(
        stmt.values(
            balance_millicredits=acct.c.balance_millicredits + amount_millicredits,
            updated_at=to_datetime(now),
        ).returning(acct.c.balance_millicredits)
    ).one_or_none()
    if result is None:
        held = balance(conn, user_id)  # NotFound without an account
        raise Conflict(
            f"cannot remove {-amount_millicredits / 1000:g} credits: "
            f"{held.available_millicredits / 1000:g} available (balance "
            f"{held.balance_millicredits / 1000:g}, {held.reserved_millicredits / 1000:g}"
            " reserved by unfinished jobs)",
            user_id=user_id,
            available_credits=held.available_millicredits / 1000,
        )
    conn.execute(
        insert(t.credit_ledger).values(
            user_id=user_id,
            kind="grant" if amount_millicredits >= 0 else "adjust",
            amount_millicredits=amount_millicredits,
            note=note,
            created_at=to_datetime(now),
        )
    )
    return int(result.balance_millicredits)


@dataclass(frozen=True, slots=True)
class Balance:
    balance_millicredits: int
    reserved_millicredits: int

    @property
    def available_millicredits(self) -> int:
        return self.balance_millicredits - self.reserved_millicredits


def balance(conn: Connection, user_id: str) -> Balance:
    row = conn.execute(
        select(
            t.credit_accounts.c.balance_millicredits, t.credit_accounts.c.reserved_millicredits
        ).where(t.credit_accounts.c.user_id == user_id)
    ).first()
    if row is None:
        raise NotFound(f"no credit account for user {user_id!r}", user_id=user_id)
    return Balance(int(row.balance_millicredits), int(row.reserved_millicredits))


# Built once: it runs in every upload's and every completion's transaction.
_ADD_STORED_BYTES = (
    update(t.users)
    .where(t.users.c.user_id == bindparam("b_user"))
    .values(stored_bytes=t.users.c.stored_bytes + bindparam("b_delta"))
)


def add_stored_bytes(conn: Connection, deltas: Mapping[str, int]) -> None:
    """Move each user's count of stored bytes (``users.stored_bytes``) by its delta: in
    the transaction that inserts, resizes or deletes their objects. Users in id order,
    so two transactions that touch the same users lock them in the same order."""
    moves = [{"b_user": u, "b_delta": deltas[u]} for u in sorted(deltas) if deltas[u]]
    if moves:
        conn.execute(_ADD_STORED_BYTES, moves)
