"""``sync_profiles`` (every ``db upgrade`` and every ``Stack.open(auto_migrate=True)``):
the configured profiles written to ``processing_profiles``, only they active, a changed
``params`` under an existing version refused; in a statement per kind of write, not one
per profile (a stack opened on a fresh record wrote its 11 profiles one by one)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import pytest
from sqlalchemy import Engine, select

from hypermedia.clock import to_datetime
from hypermedia.config import DEFAULT_QUEUES, REPO_ETC
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import ConfigError
from hypermedia.jobs.catalog import ProfileCatalog, record_values, sync_profiles
from hypermedia.profiles import Profile, load_profiles
from tests import support

T0 = 1_900_000_000.0


@pytest.fixture
def shipped() -> dict[str, Profile]:
    return load_profiles(REPO_ETC / "profiles.toml", DEFAULT_QUEUES)


def _rows(engine: Engine) -> dict[tuple[str, int], dict[str, Any]]:
    with transaction(engine) as conn:
        rows = conn.execute(select(t.profiles).order_by(t.profiles.c.profile_id)).mappings()
        return {(r["operation"], r["version"]): dict(r) for r in rows}


def _writes(engine: Engine) -> AbstractContextManager[list[str]]:
    """The INSERT/UPDATE statements ``engine`` sends in the block (an executemany: one)."""
    return support.statements_sent(engine, "INSERT", "UPDATE")


def test_a_fresh_record_gets_every_profile_active_in_one_insert(engine, shipped):
    with _writes(engine) as sent, transaction(engine) as conn:
        sync_profiles(conn, shipped, T0)
    assert len(sent) == 1 and sent[0].lstrip().upper().startswith("INSERT"), sent
    rows = _rows(engine)
    assert list(rows) == [(op, p.version) for op, p in shipped.items()]  # ids in file order
    for (operation, _version), row in rows.items():
        assert row["active"] is True
        assert row["created_at"] == row["updated_at"] == to_datetime(T0)
        assert {k: row[k] for k in record_values(shipped[operation])} == record_values(
            shipped[operation]
        )
    assert sorted(ProfileCatalog.load(engine).operations()) == sorted(shipped)


def test_a_second_sync_updates_reactivates_and_deactivates(engine, shipped):
    with transaction(engine) as conn:
        sync_profiles(conn, shipped, T0)
    first = _rows(engine)
    dropped, changed, *_ = shipped
    costlier = shipped[changed].model_copy(update={"base_cost": 0.777})
    bumped = shipped[changed].model_copy(update={"version": shipped[changed].version + 1})
    again = {op: p for op, p in shipped.items() if op not in (dropped, changed)}
    with _writes(engine) as sent, transaction(engine) as conn:
        sync_profiles(conn, {**again, changed: costlier}, T0 + 60)
    # deactivate the rest, then the kept ones (one statement, executemany)
    assert [s.lstrip().split()[0].upper() for s in sent] == ["UPDATE", "UPDATE"], sent
    second = _rows(engine)
    assert second[(dropped, shipped[dropped].version)] == {
        **first[(dropped, shipped[dropped].version)],
        "active": False,
    }
    for key, row in second.items():
        if key[0] == dropped:
            continue
        assert row["active"] is True
        assert row["profile_id"] == first[key]["profile_id"]
        assert row["created_at"] == to_datetime(T0)
        assert row["updated_at"] == to_datetime(T0 + 60)
    assert second[(changed, shipped[changed].version)]["base_cost_millicredits"] == 777

    with _writes(engine) as sent, transaction(engine) as conn:
        sync_profiles(conn, {**shipped, changed: bumped}, T0 + 120)
    kinds = sorted(s.lstrip().split()[0].upper() for s in sent)
    assert kinds == ["INSERT", "UPDATE", "UPDATE"], sent
    third = _rows(engine)
    assert third[(dropped, shipped[dropped].version)]["active"] is True  # back again
    assert third[(changed, shipped[changed].version)]["active"] is False  # replaced
    assert third[(changed, bumped.version)]["active"] is True
    assert third[(changed, bumped.version)]["created_at"] == to_datetime(T0 + 120)
    assert ProfileCatalog.load(engine).get(changed).version == bumped.version


def test_changed_params_under_the_same_version_are_refused_and_nothing_is_written(engine, shipped):
    with transaction(engine) as conn:
        sync_profiles(conn, shipped, T0)
    before = _rows(engine)
    *_, last = shipped
    changed = shipped[last].model_copy(update={"params": {**shipped[last].params, "x": 1}})
    with (
        pytest.raises(ConfigError, match="bump the version") as raised,
        transaction(engine) as conn,
    ):
        sync_profiles(conn, {**shipped, last: changed}, T0 + 60)
    assert raised.value.key == f"profiles.{last}.version"
    assert _rows(engine) == before
