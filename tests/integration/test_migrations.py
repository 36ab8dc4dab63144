"""The Alembic migrations: reversible, and in agreement with the models, on both databases."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, column, insert, inspect, select, table
from sqlalchemy.exc import IntegrityError

from hypermedia.clock import ManualClock, to_datetime
from hypermedia.db import migrate
from hypermedia.db import tables as t
from hypermedia.db.engine import make_engine
from hypermedia.db.models import metadata
from hypermedia.storage import deletions
from hypermedia.storage.base import original_key
from hypermedia.storage.local import LocalStorage
from tests import support

TABLES = {
    "users",
    "pools",
    "pool_members",
    "objects",
    "api_keys",
    "credit_accounts",
    "credit_ledger",
    "processing_profiles",
    "submissions",
    "processing_jobs",
    "job_attempts",
    "job_outputs",
    "job_callbacks",
    "job_checkpoints",
    "workers",
    "worker_metrics",
    "scheduler_decisions",
    "scheduler_state",
    "cloud_spend",
    "alerts",
    "alert_deliveries",
    "queue_samples",
    "bulk_runs",
    "blob_deletions",
}


@pytest.fixture(params=["postgresql", "sqlite"])
def empty_engine(request, tmp_path) -> Iterator[Engine]:
    """An engine on a database with no tables at all."""
    if request.param == "postgresql":
        server = request.getfixturevalue("pg_server")
        name = support.unique_name("mig")
        engine = make_engine(server.create_database(name))
        yield engine
        engine.dispose()
        server.drop_database(name)
    else:
        engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
        yield engine
        engine.dispose()


class Revisions:
    """Databases brought from nothing to a revision as copies of one this process
    upgraded there (PostgreSQL: CREATE DATABASE ... TEMPLATE; SQLite: its file): a
    test's upgrade from nothing to where its case starts cost ~0.6 CPU-s on PostgreSQL
    (Alembic's ~0.3, the server's ~0.3), a copy ~0.1 of the server's. Each template
    is made from the nearest one below it, so every migration still runs (once a
    process), in the test that first needs it; the upgrade from nothing itself is
    test_upgrade_downgrade_upgrade's and its neighbours'."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._server: support.PostgresServer | None = None
        self._made: dict[tuple[str, str], str] = {}  # (dialect, revision): name or path

    def bring(self, engine: Engine, revision: str = "head") -> None:
        """Make ``engine``'s database (empty, nothing connected to it) what
        ``migrate.upgrade(engine, revision)`` would make of it."""
        if revision == "head":
            head = migrate.head_revision()
            assert head is not None
            revision = head
        dialect = engine.dialect.name
        template = self._made.get((dialect, revision)) or self._make(dialect, revision)
        database = engine.url.database
        assert database, engine.url
        engine.dispose()
        if dialect == "postgresql":
            self.server.drop_database(database)
            self.server.create_database(database, template=template)
        else:
            self._copy(Path(template), Path(database))

    @property
    def server(self) -> support.PostgresServer:
        if self._server is None:
            self._server = support.PostgresServer(support.pg_server_url())
        return self._server

    def _make(self, dialect: str, revision: str) -> str:
        below = [r for d, r in self._made if d == dialect and r < revision]
        start = self._made[(dialect, max(below))] if below else None
        if dialect == "postgresql":
            made = support.unique_name("migrev")
            url = self.server.create_database(made, template=start)
        else:
            made = str(self._root / f"{revision}.db")
            if start is not None:
                self._copy(Path(start), Path(made))
            url = f"sqlite:///{made}"
        engine = make_engine(url)
        try:
            migrate.upgrade(engine, revision)
        finally:
            engine.dispose()
        self._made[(dialect, revision)] = made
        return made

    @staticmethod
    def _copy(source: Path, target: Path) -> None:
        """``source`` (closed) as ``target``, whose own write-ahead log, if any, goes."""
        for suffix in ("-wal", "-shm"):
            Path(f"{target}{suffix}").unlink(missing_ok=True)
        read, write = sqlite3.connect(source), sqlite3.connect(target)
        try:
            read.backup(write)
        finally:
            read.close()
            write.close()

    def close(self) -> None:
        if self._server is not None:
            for (dialect, _), made in self._made.items():
                if dialect == "postgresql":
                    self._server.drop_database(made)
            self._server.dispose()


@pytest.fixture(scope="session")
def revisions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Revisions]:
    """:class:`Revisions`, for the process (each xdist worker makes its own)."""
    made = Revisions(tmp_path_factory.mktemp("revisions"))
    yield made
    made.close()


def table_names(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def schema_diffs(engine: Engine) -> list[object]:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))


def test_models_cover_the_expected_tables():
    assert set(metadata.tables) == TABLES


def test_upgrade_downgrade_upgrade(empty_engine):
    assert table_names(empty_engine) == set()
    assert migrate.current_revision(empty_engine) is None

    migrate.upgrade(empty_engine)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()
    assert table_names(empty_engine) == TABLES
    assert schema_diffs(empty_engine) == []

    migrate.downgrade(empty_engine, "base")
    assert migrate.current_revision(empty_engine) is None
    assert table_names(empty_engine) == set()

    migrate.upgrade(empty_engine)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()
    assert table_names(empty_engine) == TABLES
    assert schema_diffs(empty_engine) == []


def test_the_revisions_read_without_alembic_are_alembics(empty_engine):
    """hypermedia.db.migrate reads the head from the files and the database's revision
    from its table without importing Alembic: the same answers as Alembic's, at every
    step (no table, an older revision, the head, back at base)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.alembic_config())
    head = script.get_current_head()
    assert head is not None and migrate.head_revision() == head

    def alembics() -> str | None:
        with empty_engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    seen = [migrate.current_revision(empty_engine)]
    assert seen[-1] is None and alembics() is None
    older = script.get_revision(head).down_revision
    assert isinstance(older, str)
    for target in (older, "head"):
        migrate.upgrade(empty_engine, target)
        seen.append(migrate.current_revision(empty_engine))
        assert seen[-1] == alembics()
    migrate.downgrade(empty_engine, "base")
    seen.append(migrate.current_revision(empty_engine))
    assert seen[-1] == alembics()
    assert seen == [None, older, head, None]


def test_upgrade_twice_is_a_no_op(empty_engine):
    migrate.upgrade(empty_engine)
    migrate.upgrade(empty_engine)
    assert migrate.current_revision(empty_engine) == migrate.head_revision()
    assert schema_diffs(empty_engine) == []


def test_a_record_at_the_newest_revision_is_not_asked_what_keeps_it_from_upgrading(
    engine, settings
):
    """``db upgrade`` and every ``Stack.open(auto_migrate=True)`` on a record at the
    newest revision asked it what would refuse an upgrade (its tables listed, its
    revision read) and then read its revision again, for nothing: now it reads the
    revision once (old: 2) and syncs the profiles."""
    from sqlalchemy import event

    from hypermedia.db.upgrade import migrate as upgrade_record
    from hypermedia.jobs.catalog import ProfileCatalog

    sent: list[str] = []

    def note(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        upgrade_record(settings(), engine)
    finally:
        event.remove(engine, "before_cursor_execute", note)
    reads = [s for s in sent if s.lstrip().upper().startswith("SELECT") and "version_num" in s]
    assert len(reads) == 1, reads
    assert len(ProfileCatalog.load(engine))


def test_the_fixture_databases_match_the_models(engine):
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert schema_diffs(engine) == []


def test_job_outputs_has_the_unique_constraint(engine):
    constraints = {
        c["name"]: c["column_names"] for c in inspect(engine).get_unique_constraints("job_outputs")
    }
    assert constraints["uk_job_type_profile"] == ["job_id", "output_type", "profile_version"]


@pytest.mark.parametrize(
    ("table", "name", "columns"),
    [
        ("processing_profiles", "uk_profile_operation_version", ["operation", "version"]),
        ("submissions", "uk_submission_key", ["user_id", "idempotency_key"]),
        ("job_attempts", "uk_attempt_number", ["job_id", "attempt_number"]),
        ("cloud_spend", "uk_spend_instance", ["provider", "instance_id"]),
    ],
)
def test_other_named_unique_constraints(engine, table, name, columns):
    found = inspect(engine).get_unique_constraints(table)
    assert {c["name"]: c["column_names"] for c in found}[name] == columns


@pytest.mark.parametrize(
    ("table", "name", "columns"),
    [
        ("objects", "uk_object_idempotency_key", ["owner_id", "idempotency_key"]),
        ("processing_jobs", "uk_jobs_bulk_run_object", ["bulk_run_id", "object_id"]),
        ("bulk_runs", "uk_bulk_run_idempotency_key", ["created_by", "idempotency_key"]),
        ("credit_ledger", "uk_credit_ledger_job_charge", ["job_id"]),
    ],
)
def test_named_unique_indexes(engine, table, name, columns):
    """The unique rules made as indexes (a reflection lists them apart from constraints):
    0020's upload keys, 0016's one job per object in a bulk run, 0024's bulk run keys."""
    found = {i["name"]: i for i in inspect(engine).get_indexes(table)}
    assert found[name]["unique"] and found[name]["column_names"] == columns


def test_one_output_row_per_job_type_and_profile_version(engine):
    now = to_datetime(1_800_000_000.0)
    with engine.begin() as conn:
        conn.execute(insert(t.users), [{"user_id": "u" * 32, "name": "ann", "created_at": now}])
        conn.execute(insert(t.pools), [{"pool_id": "p1", "name": "pool", "created_at": now}])
        conn.execute(
            insert(t.objects),
            [
                {
                    "object_id": "o" * 32,
                    "pool_id": "p1",
                    "owner_id": "u" * 32,
                    "storage_key": "originals/p1/o",
                    "filename": "a.png",
                    "size_bytes": 10,
                    "created_at": now,
                }
            ],
        )
        profile_id = conn.execute(
            insert(t.profiles).returning(t.profiles.c.profile_id),
            {
                "operation": "thumbnail",
                "version": 1,
                "queue": "images",
                "base_cost_millicredits": 100,
                "cost_per_mb_millicredits": 20,
                "timeout_seconds": 30,
                "memory_limit_mb": 1024,
                "max_input_bytes": 1000,
                "max_attempts": 3,
                "default_priority": 2,
                "params": {},
                "created_at": now,
                "updated_at": now,
            },
        ).scalar_one()
        conn.execute(
            insert(t.submissions),
            [
                {
                    "submission_id": "s" * 32,
                    "user_id": "u" * 32,
                    "request_hash": "h" * 64,
                    "estimated_millicredits": 120,
                    "created_at": now,
                }
            ],
        )
        conn.execute(
            insert(t.jobs),
            [
                {
                    "job_id": "j" * 32,
                    "submission_id": "s" * 32,
                    "user_id": "u" * 32,
                    "object_id": "o" * 32,
                    "profile_id": profile_id,
                    "operation": "thumbnail",
                    "queue": "images",
                    "priority": 2,
                    "status": "completed",
                    "params": {},
                    "estimated_millicredits": 120,
                    "reserved_millicredits": 120,
                    "max_attempts": 3,
                    "created_at": now,
                    "updated_at": now,
                }
            ],
        )

    def output(profile_version: int, output_type: str = "thumbnail") -> dict[str, object]:
        return {
            "job_id": "j" * 32,
            "output_type": output_type,
            "profile_version": profile_version,
            "storage_key": f"derived/p1/{'o' * 32}/{profile_version}/{output_type}",
            "size_bytes": 5,
            "created_at": now,
        }

    with engine.begin() as conn:
        conn.execute(insert(t.outputs), [output(1), output(2), output(1, "preview")])
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(t.outputs), [output(1)])
    with engine.connect() as conn:
        assert len(conn.execute(t.outputs.select()).all()) == 3


def test_stored_bytes_starts_from_each_users_live_objects(revisions, empty_engine):
    """0015 adds users.stored_bytes and fills it from the objects already there: each
    user's live objects (deleted ones and other users' not counted)."""
    revisions.bring(empty_engine, "0014")
    moment = to_datetime(1_700_000_000.0)
    users = table(
        "users", column("user_id"), column("name"), column("is_operator"), column("created_at")
    )
    pools = table("pools", column("pool_id"), column("name"), column("created_at"))
    objects = table(
        "objects",
        *(column(name) for name in ("object_id", "pool_id", "owner_id", "kind", "storage_key")),
        *(column(name) for name in ("filename", "size_bytes", "created_at", "deleted_at")),
    )
    with empty_engine.begin() as conn:
        conn.execute(
            insert(users),
            [
                {"user_id": u, "name": u, "is_operator": False, "created_at": moment}
                for u in ("ann", "bob", "cid")
            ],
        )
        conn.execute(insert(pools).values(pool_id="p", name="p", created_at=moment))
        conn.execute(
            insert(objects),
            [
                {
                    "object_id": f"o{n}",
                    "pool_id": "p",
                    "owner_id": owner,
                    "kind": "original",
                    "storage_key": f"k{n}",
                    "filename": "f",
                    "size_bytes": size,
                    "created_at": moment,
                    "deleted_at": moment if deleted else None,
                }
                for n, (owner, size, deleted) in enumerate(
                    [("ann", 100, False), ("ann", 20, False), ("ann", 7, True), ("bob", 5, False)]
                )
            ],
        )
    migrate.upgrade(empty_engine)
    with empty_engine.connect() as conn:
        stored = {u: n for u, n in conn.execute(select(t.users.c.user_id, t.users.c.stored_bytes))}
    assert stored == {"ann": 120, "bob": 5, "cid": 0}


def test_the_job_indexes_a_claim_and_a_completion_keep_up(revisions, empty_engine):
    """0016: the bulk run indexes and completed_at's are partial (a job outside bulk
    runs, or not ended, has no entry in them) and user_id has no index of its own."""
    revisions.bring(empty_engine)
    with empty_engine.connect() as conn:
        if empty_engine.dialect.name == "postgresql":
            rows = conn.exec_driver_sql(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'processing_jobs'"
            )
        else:
            rows = conn.exec_driver_sql(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index'"
                " AND tbl_name = 'processing_jobs' AND sql IS NOT NULL"
            )
        found = {name: " ".join(definition.split()) for name, definition in rows}
    partial = {name for name, definition in found.items() if " WHERE " in definition.upper()}
    assert partial == {
        "uk_jobs_bulk_run_object",
        "ix_jobs_bulk_run_status",
        "ix_processing_jobs_completed_at",
    }
    assert "ix_processing_jobs_user_id" not in found and "ix_jobs_user_job" in found
    assert "bulk_run_id IS NOT NULL" in found["uk_jobs_bulk_run_object"]
    assert "completed_at IS NOT NULL" in found["ix_processing_jobs_completed_at"]


def test_the_ledgers_ended_rows_from_before_request_ids_count_as_reconciled(
    revisions, empty_engine
):
    """0017: cloud_spend.request_id. An ended row from before has none, so a bill that
    names only the request tag cannot find it: it is marked reconciled (billed unknown)
    rather than reported by the first reconciliation as billed nothing. A running row
    stays open to reconciliation (the next listing gives it its request id)."""
    revisions.bring(empty_engine, "0016")
    names = ("provider", "instance_id", "node_type", "region", "spot")
    spend = table(
        "cloud_spend",
        *(column(name) for name in names),
        *(column(name) for name in ("price_per_hour_microusd", "launched_at", "terminated_at")),
        column("reconciled_at"),
    )
    launched, ended = to_datetime(1_800_000_000.0), to_datetime(1_800_003_600.0)
    with empty_engine.begin() as conn:
        conn.execute(
            insert(spend),
            [
                {
                    "provider": "aws",
                    "instance_id": name,
                    "node_type": "burst_ocr",
                    "region": "eu-west-3",
                    "spot": False,
                    "price_per_hour_microusd": 170_000,
                    "launched_at": launched,
                    "terminated_at": end,
                }
                for name, end in (("i-ended", ended), ("i-running", None))
            ],
        )
    migrate.upgrade(empty_engine)
    with empty_engine.connect() as conn:
        found = conn.execute(
            select(spend.c.instance_id, spend.c.reconciled_at, spend.c.terminated_at)
        ).all()
    rows = {r.instance_id: r for r in found}
    assert rows["i-running"].reconciled_at is None
    assert rows["i-ended"].reconciled_at is not None
    assert rows["i-ended"].reconciled_at == rows["i-ended"].terminated_at  # as stored


def test_the_jobs_from_before_reservations_reserved_their_estimates(revisions, empty_engine):
    """0018: processing_jobs.reserved_millicredits, what a job's submit held (the
    estimate plus the most its step's priced units may cost). A job from before held
    its estimate: a live one's row gets that, so releasing or completing it gives back
    exactly what its submit reserved; an ended one holds nothing (0: the migration
    rewrites only the live jobs' rows, not the whole table). Every job written since
    must give it (PostgreSQL keeps no default)."""
    revisions.bring(empty_engine, "0017")
    moment = to_datetime(1_800_000_000.0)
    rows = {
        "users": [{"user_id": "u", "name": "ann", "is_operator": False, "created_at": moment}],
        "pools": [{"pool_id": "p", "name": "p", "created_at": moment}],
        "objects": [
            {
                "object_id": "o",
                "pool_id": "p",
                "owner_id": "u",
                "kind": "original",
                "storage_key": "k",
                "filename": "f",
                "size_bytes": 1,
                "created_at": moment,
            }
        ],
        "processing_profiles": [
            {
                "profile_id": 1,
                "operation": "ocr",
                "version": 1,
                "queue": "ocr",
                "base_cost_millicredits": 1000,
                "cost_per_mb_millicredits": 200,
                "timeout_seconds": 30,
                "memory_limit_mb": 1024,
                "max_input_bytes": 1000,
                "max_attempts": 2,
                "default_priority": 4,
                "params": "{}",
                "active": True,
                "created_at": moment,
                "updated_at": moment,
            }
        ],
        "submissions": [
            {
                "submission_id": "s",
                "user_id": "u",
                "request_hash": "h",
                "estimated_millicredits": 3400,
                "created_at": moment,
            }
        ],
        "processing_jobs": [
            {
                "job_id": job_id,
                "submission_id": "s",
                "user_id": "u",
                "object_id": "o",
                "profile_id": 1,
                "operation": "ocr",
                "queue": "ocr",
                "priority": 4,
                "status": status,
                "params": "{}",
                "estimated_millicredits": estimate,
                "attempt_count": 0,
                "max_attempts": 2,
                "cancel_requested": False,
                "created_at": moment,
                "updated_at": moment,
            }
            for job_id, status, estimate in (
                ("queued", "queued", 1200),
                ("retrying", "retry_wait", 1300),
                ("done", "completed", 2200),
            )
        ],
    }
    with empty_engine.begin() as conn:
        for name, values in rows.items():
            conn.execute(insert(table(name, *(column(key) for key in values[0]))), values)
    migrate.upgrade(empty_engine)
    jobs = table("processing_jobs", column("job_id"), column("reserved_millicredits"))
    with empty_engine.connect() as conn:
        found = dict(conn.execute(select(jobs.c.job_id, jobs.c.reserved_millicredits)).all())
    assert found == {"queued": 1200, "retrying": 1300, "done": 0}
    if empty_engine.dialect.name == "postgresql":
        (column_info,) = [
            c
            for c in inspect(empty_engine).get_columns("processing_jobs")
            if c["name"] == "reserved_millicredits"
        ]
        assert column_info["default"] is None and column_info["nullable"] is False
    migrate.downgrade(empty_engine, "0017")
    names = {c["name"] for c in inspect(empty_engine).get_columns("processing_jobs")}
    assert "reserved_millicredits" not in names and "estimated_millicredits" in names


def test_objects_from_before_upload_keys_have_none_and_a_key_is_one_object_per_owner(
    revisions,
    empty_engine,
):
    """0020: objects.idempotency_key, unique per owner (``uk_object_idempotency_key``).
    The objects from before have no key, and any number of objects without one live
    side by side; one owner's key names one object, another owner's same key another."""
    revisions.bring(empty_engine, "0019")
    moment = to_datetime(1_800_000_000.0)
    objects = table(
        "objects",
        *(
            column(name)
            for name in (
                "object_id",
                "pool_id",
                "owner_id",
                "kind",
                "storage_key",
                "filename",
                "size_bytes",
                "created_at",
            )
        ),
    )

    def obj(object_id: str, owner: str, **more: str | None) -> dict[str, object]:
        return {
            "object_id": object_id,
            "pool_id": "p",
            "owner_id": owner,
            "kind": "original",
            "storage_key": object_id,
            "filename": "f",
            "size_bytes": 1,
            "created_at": moment,
            **more,
        }

    with empty_engine.begin() as conn:
        conn.execute(
            insert(table("users", *map(column, ("user_id", "name", "is_operator", "created_at")))),
            [
                {"user_id": u, "name": u, "is_operator": False, "created_at": moment}
                for u in ("u", "v")
            ],
        )
        conn.execute(
            insert(table("pools", column("pool_id"), column("name"), column("created_at"))),
            [{"pool_id": "p", "name": "p", "created_at": moment}],
        )
        conn.execute(insert(objects), [obj("old", "u")])
    migrate.upgrade(empty_engine)
    keyed = table(objects.name, *(column(c.name) for c in objects.c), column("idempotency_key"))
    with empty_engine.begin() as conn:
        assert conn.execute(select(keyed.c.idempotency_key)).scalars().all() == [None]
        conn.execute(
            insert(keyed),
            [
                obj("none", "u", idempotency_key=None),
                obj("k-u", "u", idempotency_key="k"),
                obj("k-v", "v", idempotency_key="k"),
            ],
        )
    with pytest.raises(IntegrityError), empty_engine.begin() as conn:
        conn.execute(insert(keyed), [obj("k-u-again", "u", idempotency_key="k")])
    migrate.downgrade(empty_engine, "0019")
    names = {c["name"] for c in inspect(empty_engine).get_columns("objects")}
    assert "idempotency_key" not in names and "owner_id" in names
    indexes = {i["name"] for i in inspect(empty_engine).get_indexes("objects")}
    assert "uk_object_idempotency_key" not in indexes


def test_runs_from_before_create_keys_have_none_and_a_key_is_one_run_per_creator(
    revisions, empty_engine
):
    """0024: bulk_runs.idempotency_key and request_hash, unique per creator
    (``uk_bulk_run_idempotency_key``): the runs from before have no key and any number
    without one live side by side; one creator's key names one run, another's the same
    key another; the downgrade drops both columns and the index."""
    revisions.bring(empty_engine, "0023")
    moment = to_datetime(1_800_000_000.0)
    names = ["run_id", "kind", "filter", "priority", "max_in_flight", "batch_size", "state"]
    names += ["scanned", "created_jobs", "skipped", "unfit", "migrated", "failed"]
    names += ["created_by", "created_at", "updated_at"]
    bulk_runs = table("bulk_runs", *map(column, names))

    def run(run_id: str, creator: str, **more: str | None) -> dict[str, object]:
        counts = dict.fromkeys(("scanned", "created_jobs", "skipped", "unfit"), 0)
        return {
            "run_id": run_id,
            "kind": "backfill",
            "filter": "{}",  # JSON text: a bare table() has no JSON type to bind it
            "priority": 8,
            "max_in_flight": 200,
            "batch_size": 500,
            "state": "creating",
            **counts,
            "migrated": 0,
            "failed": 0,
            "created_by": creator,
            "created_at": moment,
            "updated_at": moment,
            **more,
        }

    with empty_engine.begin() as conn:
        conn.execute(insert(bulk_runs), [run("old", "cli:ann")])
    migrate.upgrade(empty_engine)
    keyed = table(bulk_runs.name, *(column(c.name) for c in bulk_runs.c), column("idempotency_key"))
    with empty_engine.begin() as conn:
        assert conn.execute(select(keyed.c.idempotency_key)).scalars().all() == [None]
        conn.execute(
            insert(keyed),
            [
                run("none", "cli:ann", idempotency_key=None),
                run("k-ann", "cli:ann", idempotency_key="k"),
                run("k-bob", "api:bob", idempotency_key="k"),
            ],
        )
    with pytest.raises(IntegrityError), empty_engine.begin() as conn:
        conn.execute(insert(keyed), [run("k-ann-again", "cli:ann", idempotency_key="k")])
    migrate.downgrade(empty_engine, "0023")
    columns = {c["name"] for c in inspect(empty_engine).get_columns("bulk_runs")}
    assert not {"idempotency_key", "request_hash"} & columns and "created_by" in columns
    indexes = {i["name"] for i in inspect(empty_engine).get_indexes("bulk_runs")}
    assert "uk_bulk_run_idempotency_key" not in indexes


def test_runs_from_before_totals_have_none(revisions, empty_engine):
    """0027: bulk_runs.total (the objects a run's filter selected at create): NULL for
    the runs from before (their progress has no total while they scan); the downgrade
    drops it."""
    revisions.bring(empty_engine, "0026")
    migrate.upgrade(empty_engine)
    columns = {c["name"]: c for c in inspect(empty_engine).get_columns("bulk_runs")}
    assert columns["total"]["nullable"] and columns["total"]["default"] is None
    migrate.downgrade(empty_engine, "0026")
    assert "total" not in {c["name"] for c in inspect(empty_engine).get_columns("bulk_runs")}


def test_jobs_and_profiles_from_before_job_timeouts_keep_their_profiles_time(
    revisions, empty_engine
):
    """0021: processing_jobs.timeout_seconds (a job's own time, from its pages) and
    processing_profiles.timeout_seconds_per_page / max_timeout_seconds. Rows from before
    get NULL (a job runs under its profile's timeout_seconds; a profile gives no time a
    page) and none is rewritten; a job written after keeps its own time."""
    revisions.bring(empty_engine, "0020")
    moment = to_datetime(1_800_000_000.0)
    rows = {
        "users": [{"user_id": "u", "name": "ann", "is_operator": False, "created_at": moment}],
        "pools": [{"pool_id": "p", "name": "p", "created_at": moment}],
        "objects": [
            {
                "object_id": "o",
                "pool_id": "p",
                "owner_id": "u",
                "kind": "original",
                "storage_key": "k",
                "filename": "f",
                "size_bytes": 1,
                "created_at": moment,
            }
        ],
        "processing_profiles": [
            {
                "profile_id": 1,
                "operation": "ocr",
                "version": 3,
                "queue": "ocr",
                "base_cost_millicredits": 1000,
                "cost_per_mb_millicredits": 200,
                "timeout_seconds": 300,
                "memory_limit_mb": 1024,
                "max_input_bytes": 1000,
                "max_attempts": 2,
                "default_priority": 4,
                "params": "{}",
                "active": True,
                "created_at": moment,
                "updated_at": moment,
            }
        ],
        "submissions": [
            {
                "submission_id": "s",
                "user_id": "u",
                "request_hash": "h",
                "estimated_millicredits": 1000,
                "created_at": moment,
            }
        ],
    }

    def job(job_id: str, **more: object) -> dict[str, object]:
        return {
            "job_id": job_id,
            "submission_id": "s",
            "user_id": "u",
            "object_id": "o",
            "profile_id": 1,
            "operation": "ocr",
            "queue": "ocr",
            "priority": 4,
            "status": "queued",
            "params": "{}",
            "estimated_millicredits": 1000,
            "reserved_millicredits": 1000,
            "attempt_count": 0,
            "max_attempts": 2,
            "cancel_requested": False,
            "created_at": moment,
            "updated_at": moment,
            **more,
        }

    with empty_engine.begin() as conn:
        for name, values in rows.items():
            conn.execute(insert(table(name, *(column(key) for key in values[0]))), values)
        conn.execute(insert(table("processing_jobs", *map(column, job("old")))), [job("old")])
    migrate.upgrade(empty_engine)
    jobs = table("processing_jobs", *map(column, job("new", timeout_seconds=780)))
    profiles = table(
        "processing_profiles",
        column("profile_id"),
        column("timeout_seconds_per_page"),
        column("max_timeout_seconds"),
    )
    with empty_engine.begin() as conn:
        conn.execute(insert(jobs), [job("new", timeout_seconds=780)])
        found = dict(conn.execute(select(jobs.c.job_id, jobs.c.timeout_seconds)).all())
        (profile,) = conn.execute(select(profiles)).all()
    assert found == {"old": None, "new": 780}
    assert tuple(profile) == (1, None, None)
    migrate.downgrade(empty_engine, "0020")
    names = {c["name"] for c in inspect(empty_engine).get_columns("processing_jobs")}
    assert "timeout_seconds" not in names and "reserved_millicredits" in names
    names = {c["name"] for c in inspect(empty_engine).get_columns("processing_profiles")}
    assert not names & {"timeout_seconds_per_page", "max_timeout_seconds"}
    assert "timeout_seconds" in names


def test_code_and_schema_that_disagree_say_which_way_to_go(revisions, empty_engine, settings):
    """Old code on a schema a newer hypermedia migrated (a worker or head left behind
    by a deploy) is told to upgrade the code: `db upgrade` cannot go back (Alembic cannot
    find the revision; it was 'internal: CommandError'), and was what the message said.
    New code on an older schema names both revisions and `db upgrade`."""
    from hypermedia.cli.common import open_engine
    from hypermedia.db.upgrade import migrate as stack_migrate
    from hypermedia.errors import ConfigError
    from hypermedia.stack import Stack

    url = empty_engine.url.render_as_string(hide_password=False)
    configured = settings(database_url=url)
    head = migrate.head_revision()
    revisions.bring(empty_engine)
    version = table("alembic_version", column("version_num"))
    with empty_engine.begin() as conn:
        conn.execute(version.update().values(version_num="9999"))

    for attempt in (
        lambda: Stack.open(configured),
        lambda: open_engine(configured),
        lambda: stack_migrate(configured, empty_engine),  # `hypermedia db upgrade`
    ):
        with pytest.raises(ConfigError) as raised:
            attempt()
        message = str(raised.value)
        unknown = f"at revision 9999, which this hypermedia does not know (its newest is {head})"
        assert unknown in message, message
        assert "upgrade this installation" in message, message
    assert migrate.current_revision(empty_engine) == "9999"  # nothing was touched

    older = "0016"
    with empty_engine.begin() as conn:
        conn.execute(version.update().values(version_num=older))
    with pytest.raises(ConfigError) as raised:
        Stack.open(configured)
    assert f"at revision {older}, this hypermedia needs {head}" in str(raised.value)
    assert "run `hypermedia db upgrade`" in str(raised.value)


def test_an_embedded_record_without_a_schema_names_the_data_dir(tmp_path, settings):
    """The embedded record comes from the data dir, not from a database_url nobody set:
    its empty file (a crash before `db upgrade` made its tables) is named by the data dir
    (it named HYPERMEDIA_DATABASE_URL)."""
    from hypermedia.cli.common import open_engine
    from hypermedia.errors import ConfigError
    from hypermedia.stack import Stack

    configured = settings(data_dir=tmp_path / "data", database_url=None)
    configured.data_dir.mkdir()
    (configured.data_dir / "hypermedia.db").touch()
    for attempt in (lambda: open_engine(configured), lambda: Stack.open(configured)):
        with pytest.raises(ConfigError) as refused:
            attempt()
        assert refused.value.key == "data_dir (HYPERMEDIA_DATA_DIR)", refused.value
        assert "no schema yet: run `hypermedia db upgrade`" in refused.value.message


def test_a_migration_behind_a_long_transaction_gives_up_instead_of_holding_the_platform(
    revisions, pg_server, monkeypatch
):
    """`db upgrade` while a long transaction reads processing_jobs (a backup, a report):
    0018 alters processing_jobs (ACCESS EXCLUSIVE), so it waited for that transaction
    to end, and every submit, claim and completion queued behind it meanwhile (a submit
    took 33 s behind a 40 s read on a live stack, then in 0016's index rebuild). Now
    each try waits LOCK_TIMEOUT_SECONDS, and the last gives up, changing nothing, naming
    the session; once it has ended the migration goes through. (0016 itself now builds
    and drops concurrently: it waits for such a read without stopping any write.)"""
    import threading
    import time

    from sqlalchemy import text

    from hypermedia.errors import ServiceUnavailable

    monkeypatch.setattr(migrate, "LOCK_TIMEOUT_SECONDS", 0.5, raising=False)
    monkeypatch.setattr(migrate, "LOCK_ATTEMPTS", 2, raising=False)
    monkeypatch.setattr(migrate, "LOCK_PAUSE_SECONDS", 0.2, raising=False)
    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    holder = make_engine(engine.url.render_as_string(hide_password=False))
    try:
        revisions.bring(engine, "0017")
        outcome: list[BaseException | None] = []
        with holder.connect() as reader:
            # SET autobegins the transaction the read holds open (ACCESS SHARE).
            reader.execute(text("SET application_name = 'nightly-report'"))
            reader.execute(text("SELECT count(*) FROM processing_jobs")).scalar()
            time.sleep(0.6)  # older than a lock wait

            def run() -> None:
                try:
                    migrate.upgrade(engine)
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=run, daemon=True)
            started = time.monotonic()
            thread.start()
            thread.join(15)
            waited = time.monotonic() - started
            reader.rollback()  # lets a migration still waiting (before the fix) go on
        thread.join(30)
        assert waited < 15, "the migration waited for the long transaction to end"
        (raised,) = outcome
        assert isinstance(raised, ServiceUnavailable), raised
        assert "gave up, changing nothing" in str(raised)
        assert "'nightly-report'" in str(raised) and "processing_jobs" in str(raised)
        assert "0018_job_reservations" in str(raised)
        assert migrate.current_revision(engine) == "0017"
        migrate.upgrade(engine)  # nothing holds it up now
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert schema_diffs(engine) == []
    finally:
        holder.dispose()
        engine.dispose()
        pg_server.drop_database(name)


def test_a_migration_held_up_keeps_no_lock_of_the_migrations_before_it(
    revisions, pg_server, monkeypatch
):
    """PostgreSQL ran every migration of an upgrade in one transaction: a lock one took
    was held until the last had run. Upgrading from 0020 while a report read bulk_runs,
    0024 waited for it, and 0021's lock on processing_jobs stopped every claim and
    completion for as long (a record of 2M objects and 1M jobs upgraded from 0019 under
    writes: claims stopped 4.9 s, uploads 9.7 s). Each migration now commits alone: a
    job is written while 0024 waits; 0021-0023 stay applied when it gives up, and the
    message names 0024, what it was running and what to do."""
    import threading
    import time

    import psycopg
    from sqlalchemy import text

    from hypermedia.errors import ServiceUnavailable

    monkeypatch.setattr(migrate, "LOCK_TIMEOUT_SECONDS", 3.0, raising=False)
    monkeypatch.setattr(migrate, "LOCK_ATTEMPTS", 1, raising=False)
    name = support.unique_name("mig")
    url = pg_server.create_database(name)
    engine = make_engine(url)
    holder = make_engine(url)
    try:
        revisions.bring(engine, "0020")
        outcome: list[BaseException | None] = []
        writes: list[str] = []
        with holder.connect() as reader:
            reader.execute(text("SET application_name = 'nightly-report'"))
            reader.execute(text("SELECT count(*) FROM bulk_runs")).scalar()
            time.sleep(3.1)  # older than a lock wait

            def run() -> None:
                try:
                    migrate.upgrade(engine)
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            time.sleep(1.0)  # 0021-0023 are done; 0024 waits for the report
            plain = engine.url.set(drivername="postgresql")
            with psycopg.connect(plain.render_as_string(hide_password=False)) as writer:
                writer.autocommit = True
                writer.execute("SET lock_timeout = '1500ms'")
                started = time.monotonic()
                try:
                    writer.execute("UPDATE processing_jobs SET priority = 1 WHERE job_id = 'j'")
                    writes.append(f"written in {time.monotonic() - started:.2f} s")
                except psycopg.errors.LockNotAvailable:
                    writes.append(f"waited {time.monotonic() - started:.2f} s, gave up")
            thread.join(30)
            reader.rollback()
        assert writes[0].startswith("written in 0."), writes
        (raised,) = outcome
        assert isinstance(raised, ServiceUnavailable), raised
        message = str(raised)
        assert "the migration 0024_bulk_run_idempotency_keys" in message, message
        assert "gave up, changing nothing of it" in message, message
        assert "ALTER TABLE bulk_runs" in message, message
        assert "the database is at 0023" in message, message
        assert "'nightly-report'" in message, message
        assert "Run `hypermedia db upgrade` again" in message, message
        assert migrate.current_revision(engine) == "0023"
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert schema_diffs(engine) == []
    finally:
        holder.dispose()
        engine.dispose()
        pg_server.drop_database(name)


def _pg_autocommit(engine: Engine):
    import psycopg

    plain = engine.url.set(drivername="postgresql")
    return psycopg.connect(plain.render_as_string(hide_password=False), autocommit=True)


_OBJECT = (
    "INSERT INTO objects (object_id, pool_id, owner_id, kind, storage_key, filename,"
    " size_bytes, created_at) VALUES (%s, 'p', 'u', 'original', %s, 'f', 1, now())"
)


def test_an_index_built_on_objects_lets_uploads_go_on(revisions, pg_server, monkeypatch):
    """0026's CREATE INDEX on objects held a SHARE lock for the whole build, and waited
    for it behind an upload in flight while every other upload queued behind it: on a
    record of 2M objects under writes, uploads stopped 3.6 s (more on a bigger table).
    On PostgreSQL it is built CONCURRENTLY now: an upload is written while the build
    waits for the one in flight (old: the upload waited 1.5 s and gave up), and the
    index is there, valid, when it has ended."""
    import threading
    import time

    import psycopg

    monkeypatch.setattr(migrate, "LOCK_TIMEOUT_SECONDS", 3.0, raising=False)
    monkeypatch.setattr(migrate, "LOCK_ATTEMPTS", 1, raising=False)
    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, "0025")
        with _pg_autocommit(engine) as setup:
            setup.execute("INSERT INTO users VALUES ('u', 'u', false, now(), 0)")
            setup.execute("INSERT INTO pools VALUES ('p', 'p', now())")
        outcome: list[BaseException | None] = []
        writes: list[str] = []
        with _pg_autocommit(engine) as in_flight, _pg_autocommit(engine) as writer:
            in_flight.autocommit = False
            in_flight.execute(_OBJECT, ("o-in-flight", "k-in-flight"))  # not committed yet

            def run() -> None:
                try:
                    migrate.upgrade(engine, "0026")
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            time.sleep(1.0)  # the build waits for the upload in flight
            writer.execute("SET lock_timeout = '1500ms'")
            started = time.monotonic()
            try:
                writer.execute(_OBJECT, ("o-next", "k-next"))
                writes.append(f"written in {time.monotonic() - started:.2f} s")
            except psycopg.errors.LockNotAvailable:
                writes.append(f"waited {time.monotonic() - started:.2f} s, gave up")
            in_flight.commit()
            thread.join(30)
        assert writes[0].startswith("written in 0."), writes
        assert outcome == [None], outcome
        assert migrate.current_revision(engine) == "0026"
        assert _index_valid(engine, "ix_objects_source_object_id")
    finally:
        engine.dispose()
        pg_server.drop_database(name)


def _index_valid(engine: Engine, name: str) -> bool:
    """Whether PostgreSQL's index ``name`` exists and is valid (built whole)."""
    with _pg_autocommit(engine) as check:
        row = check.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", (name,)
        ).fetchone()
    return bool(row == (True,))


def test_an_index_build_that_failed_or_was_cut_short_is_finished_by_the_next_upgrade(
    revisions,
    pg_server,
):
    """A concurrent build runs outside the migration's transaction: one that failed (a
    cancelled statement, a server restart) leaves an INVALID index of its name, and one
    that ended before the revision was recorded leaves its column (0020) and its index.
    The next `db upgrade` failed on them ('column "idempotency_key" of relation
    "objects" already exists', 'relation "ix_objects_source_object_id" already exists');
    it drops an INVALID index and builds it again, and keeps what is whole."""
    import psycopg

    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, "0019")
        with _pg_autocommit(engine) as conn:
            conn.execute("INSERT INTO users VALUES ('u', 'u', false, now(), 0)")
            conn.execute("INSERT INTO pools VALUES ('p', 'p', now())")
            for i in range(2):
                conn.execute(_OBJECT, (f"o{i}", f"k{i}"))
            # 0020 cut short: its column committed, its unique index left INVALID (here
            # by a build that failed on a duplicate, as a cancelled one leaves it).
            conn.execute("ALTER TABLE objects ADD COLUMN idempotency_key VARCHAR(200)")
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute(
                    "CREATE UNIQUE INDEX CONCURRENTLY uk_object_idempotency_key"
                    " ON objects (owner_id)"
                )
        migrate.upgrade(engine, "0025")
        with _pg_autocommit(engine) as conn:
            # 0026 cut short after its index was built, before 0026 was recorded.
            conn.execute("CREATE INDEX ix_objects_source_object_id ON objects (source_object_id)")
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert schema_diffs(engine) == []
        with _pg_autocommit(engine) as conn:
            invalid = conn.execute(
                "SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid"
            ).fetchall()
            unique = conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'uk_object_idempotency_key'"
            ).fetchone()
        assert invalid == []
        assert unique is not None and "(owner_id, idempotency_key)" in unique[0], unique
    finally:
        engine.dispose()
        pg_server.drop_database(name)


class _Interrupted(BaseException):
    """What pytest-timeout raises in a test it ends (not an Exception)."""


@pytest.mark.parametrize("how", ["its session terminated", "interrupted", "cancelled"])
def test_an_index_build_that_failed_is_told_as_it_failed(revisions, pg_server, how):
    """A concurrent build (0026's, waiting here for an upload in flight) that fails is
    what the upgrade raises. One that ended the migration's connection (its session
    terminated, as by a server restart; the process interrupted mid-statement, as
    pytest-timeout did) left it invalid, and the restore of the lock_timeout and
    Alembic's end of its autocommit block each raised PendingRollbackError in the
    build's place; a cancelled statement leaves the connection usable. The next
    upgrade builds the index."""
    import signal
    import threading
    import time

    import psycopg
    from sqlalchemy.exc import OperationalError

    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, "0025")
        with _pg_autocommit(engine) as setup:
            setup.execute("INSERT INTO users VALUES ('u', 'u', false, now(), 0)")
            setup.execute("INSERT INTO pools VALUES ('p', 'p', now())")
        with _pg_autocommit(engine) as in_flight, _pg_autocommit(engine) as admin:
            in_flight.autocommit = False
            in_flight.execute(_OBJECT, ("o-in-flight", "k-in-flight"))  # the build waits

            def building() -> int | None:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    row = admin.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = %s"
                        " AND query LIKE 'CREATE INDEX CONCURRENTLY%%'"
                        " AND wait_event_type = 'Lock'",
                        (name,),
                    ).fetchone()
                    if row is not None:
                        return int(row[0])
                    time.sleep(0.05)
                in_flight.rollback()  # the build goes on: the upgrade's outcome fails
                return None

            raised: list[BaseException | None] = []
            if how == "interrupted":
                main = threading.get_ident()

                def interrupt() -> None:
                    if building() is not None:
                        signal.pthread_kill(main, signal.SIGUSR1)

                def stop(_signum: int, _frame: object) -> None:
                    raise _Interrupted("timeout")

                previous = signal.signal(signal.SIGUSR1, stop)
                interrupter = threading.Thread(target=interrupt, daemon=True)
                try:
                    interrupter.start()
                    try:
                        migrate.upgrade(engine, "0026")
                        raised.append(None)
                    except BaseException as exc:
                        raised.append(exc)
                    interrupter.join(90)
                finally:
                    signal.signal(signal.SIGUSR1, previous)
            else:

                def run() -> None:
                    try:
                        migrate.upgrade(engine, "0026")
                        raised.append(None)
                    except BaseException as exc:
                        raised.append(exc)

                thread = threading.Thread(target=run, daemon=True)
                thread.start()
                pid = building()
                if pid is not None:
                    end = "terminate" if how == "its session terminated" else "cancel"
                    admin.execute(f"SELECT pg_{end}_backend(%s)", (pid,))
                thread.join(60)
            in_flight.rollback()
        [failure] = raised
        if how == "interrupted":
            assert isinstance(failure, _Interrupted), repr(failure)
        else:
            assert isinstance(failure, OperationalError), repr(failure)
            ended = (
                psycopg.errors.AdminShutdown
                if how == "its session terminated"
                else psycopg.errors.QueryCanceled
            )
            assert isinstance(failure.orig, ended), repr(failure.orig)
        assert migrate.current_revision(engine) == "0025"
        migrate.upgrade(engine, "0026")
        assert migrate.current_revision(engine) == "0026"
        assert _index_valid(engine, "ix_objects_source_object_id")
    finally:
        engine.dispose()
        pg_server.drop_database(name)


_JOB_WRITE = "UPDATE processing_jobs SET priority = 1 WHERE job_id = %s"


def _writes_beside(
    engine: Engine, step, write: str
) -> tuple[list[str], list[BaseException | None]]:
    """Run ``step`` (a migration) in a thread while a ``write`` is in flight on another
    connection (committed after 2 s: the migration may wait that long for it) and a
    third writes every 10 ms under a 1.5 s lock timeout: the writes that gave up, and
    how ``step`` ended (None: it ran)."""
    import threading
    import time

    import psycopg

    outcome: list[BaseException | None] = []
    stalls: list[str] = []
    done = threading.Event()

    def run() -> None:
        try:
            step()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        finally:
            done.set()

    with _pg_autocommit(engine) as in_flight, _pg_autocommit(engine) as writer:
        in_flight.autocommit = False
        in_flight.execute(write, ("in-flight",))  # not committed yet
        writer.execute("SET lock_timeout = '1500ms'")
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        started = time.monotonic()
        while not done.is_set() and time.monotonic() - started < 20:
            if in_flight.info.transaction_status and time.monotonic() - started > 2.0:
                in_flight.commit()  # the migration waited 2 s for it
            began = time.monotonic()
            try:
                writer.execute(write, ("next",))
            except psycopg.errors.LockNotAvailable:
                stalls.append(f"waited {time.monotonic() - began:.2f} s, gave up")
                in_flight.rollback()
                break
            time.sleep(0.01)
        in_flight.rollback()
        thread.join(30)
    return stalls, outcome


@pytest.mark.parametrize(
    ("before", "migration"),
    [("0006", "0007"), ("0011", "0012"), ("0015", "0016")],
    ids=["0007_job_rate_indexes", "0012_jobs_by_user", "0016_fewer_job_index_entries"],
)
def test_the_job_index_migrations_let_job_writes_go_on(
    revisions, pg_server, monkeypatch, before, migration
):
    """0007 and 0012 built processing_jobs' indexes with a plain CREATE INDEX (a SHARE
    lock for the whole build) and 0016 dropped and built them so (ACCESS EXCLUSIVE), in
    the migration's transaction: behind a job write in flight the migration waited, and
    every submit, claim and completion queued behind it (on 1M jobs each build stopped
    them for seconds). On PostgreSQL they are built and dropped concurrently now: job
    writes go on throughout (old: one waited 1.5 s behind the migration and gave up),
    and the indexes are there, valid, when it has ended."""
    monkeypatch.setattr(migrate, "LOCK_TIMEOUT_SECONDS", 3.0, raising=False)
    monkeypatch.setattr(migrate, "LOCK_ATTEMPTS", 1, raising=False)
    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, before)
        stalls, outcome = _writes_beside(
            engine, lambda: migrate.upgrade(engine, migration), _JOB_WRITE
        )
        assert stalls == []
        assert outcome == [None], outcome
        assert migrate.current_revision(engine) == migration
        with _pg_autocommit(engine) as check:
            indexes = dict(
                check.execute(
                    "SELECT c.relname, i.indisvalid FROM pg_index i"
                    " JOIN pg_class c ON c.oid = i.indexrelid"
                    " WHERE i.indrelid = 'processing_jobs'::regclass"
                ).fetchall()
            )
        assert all(indexes.values()), indexes
        wanted = {
            "0007": {"ix_processing_jobs_created_at", "ix_processing_jobs_completed_at"},
            "0012": {"ix_jobs_user_job"},
            "0016": {"uk_jobs_bulk_run_object", "ix_jobs_bulk_run_status"},
        }[migration]
        assert wanted <= set(indexes), indexes
        assert not [n for n in indexes if n.endswith("_new")], indexes
    finally:
        engine.dispose()
        pg_server.drop_database(name)


@pytest.mark.parametrize(
    ("migration", "down_to", "write", "index"),
    [
        (
            "0026",
            "0025",
            "UPDATE objects SET filename = 'f' WHERE object_id = %s",
            "ix_objects_source_object_id",
        ),
        (
            "0030",
            "0029",
            "UPDATE credit_ledger SET note = '' WHERE job_id = %s",
            "uk_credit_ledger_job_charge",
        ),
    ],
    ids=["0026_objects_source_index", "0030_one_charge_per_job"],
)
def test_the_index_downgrades_let_writes_go_on(
    revisions, pg_server, monkeypatch, migration, down_to, write, index
):
    """The downgrades of 0026 and 0030 dropped their index with a plain DROP INDEX
    (ACCESS EXCLUSIVE on objects, credit_ledger) in the migration's transaction: behind
    a write in flight the downgrade waited, and every upload (every charge) queued
    behind it. On PostgreSQL they drop it concurrently now: writes go on throughout
    (old: one waited 1.5 s behind the downgrade and gave up), and the index is gone
    when it has ended."""
    monkeypatch.setattr(migrate, "LOCK_TIMEOUT_SECONDS", 3.0, raising=False)
    monkeypatch.setattr(migrate, "LOCK_ATTEMPTS", 1, raising=False)
    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, migration)
        stalls, outcome = _writes_beside(engine, lambda: migrate.downgrade(engine, down_to), write)
        assert stalls == []
        assert outcome == [None], outcome
        assert migrate.current_revision(engine) == down_to
        with _pg_autocommit(engine) as check:
            left = check.execute("SELECT 1 FROM pg_class WHERE relname = %s", (index,)).fetchall()
        assert left == []
    finally:
        engine.dispose()
        pg_server.drop_database(name)


def test_0016_cut_short_at_any_step_is_finished_by_the_next_upgrade(revisions, pg_server):
    """0016 drops and replaces processing_jobs' indexes concurrently, each step
    committing alone: an upgrade that ended part way (a killed process, a cancelled
    build) leaves some indexes replaced, a replacement built under its temporary name
    (valid, or INVALID when its build failed) or the old index gone and the new one not
    renamed yet. The next upgrade finishes each from where it was (old: 'index
    "ix_processing_jobs_user_id" does not exist'), and the schema is the models'."""
    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, "0015")
        with _pg_autocommit(engine) as conn:
            conn.execute("DROP INDEX ix_processing_jobs_user_id")
            conn.execute("DROP INDEX uk_jobs_bulk_run_object")  # replaced already
            conn.execute(
                "CREATE UNIQUE INDEX uk_jobs_bulk_run_object ON processing_jobs"
                " (bulk_run_id, object_id) WHERE bulk_run_id IS NOT NULL"
            )
            conn.execute(  # a build that failed, marked INVALID as it leaves it
                "CREATE INDEX ix_jobs_bulk_run_status_new ON processing_jobs"
                " (bulk_run_id, status) WHERE bulk_run_id IS NOT NULL"
            )
            conn.execute(
                "UPDATE pg_index SET indisvalid = false"
                " WHERE indexrelid = 'ix_jobs_bulk_run_status_new'::regclass"
            )
            conn.execute("DROP INDEX ix_processing_jobs_completed_at")  # not renamed yet
            conn.execute(
                "CREATE INDEX ix_processing_jobs_completed_at_new ON processing_jobs"
                " (completed_at) WHERE completed_at IS NOT NULL"
            )
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert schema_diffs(engine) == []
        with _pg_autocommit(engine) as conn:
            left = conn.execute(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE NOT i.indisvalid OR c.relname LIKE '%\\_new'"
            ).fetchall()
        assert left == []
    finally:
        engine.dispose()
        pg_server.drop_database(name)


# -- Migrations that read a hot table's rows: beside live writes -------------------------

# Locks that stop a table's writes (INSERT/UPDATE/DELETE take ROW EXCLUSIVE).
_STOPS_WRITES = ("ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock")


def _reads_rows(statement: str, table_name: str) -> bool:
    """Whether ``statement`` (a migration's, as pg_stat_activity shows it) reads every
    row of ``table_name``, or a part growing with them: an index build, a foreign key
    added valid or validated, an UPDATE (or a WITH ... UPDATE) or INSERT ... SELECT of the
    table."""
    import re

    if not re.search(rf"\b{table_name}\b", statement):
        return False
    return bool(
        re.match(r"\s*(CREATE (UNIQUE )?INDEX|UPDATE|INSERT|WITH)\b", statement, re.I)
        or re.search(r"VALIDATE CONSTRAINT", statement, re.I)
        or re.search(r"FOREIGN KEY(?!.*NOT VALID)", statement, re.I | re.S)
    )


def _seed_jobs(engine: Engine, jobs: int, *, users: int = 1, objects: int = 1) -> None:
    """``users`` users, ``objects`` objects spread over them, one profile and ``jobs``
    jobs (one in ten queued, the others completed), with the columns of 0001 only (those
    added since are nullable or have a default until 0018)."""
    with _pg_autocommit(engine) as conn:
        conn.execute(
            "INSERT INTO users (user_id, name, is_operator, created_at)"
            " SELECT 'u' || lpad(n::text, 7, '0'), 'u' || n, false, now()"
            " FROM generate_series(1, %s) n",
            (users,),
        )
        conn.execute("INSERT INTO pools (pool_id, name, created_at) VALUES ('p', 'p', now())")
        conn.execute(
            "INSERT INTO objects (object_id, pool_id, owner_id, kind, storage_key, filename,"
            " size_bytes, created_at) SELECT 'o' || n, 'p', 'u' || lpad((n %% %s + 1)::text,"
            " 7, '0'), 'original', 'k' || n, 'f', n %% 1000, now()"
            " FROM generate_series(1, %s) n",
            (users, objects),
        )
        conn.execute(
            "INSERT INTO processing_profiles (profile_id, operation, version, queue,"
            " base_cost_millicredits, cost_per_mb_millicredits, timeout_seconds,"
            " memory_limit_mb, max_input_bytes, max_attempts, default_priority, params,"
            " active, created_at, updated_at) VALUES (1, 'ocr', 1, 'ocr', 1000, 200, 30,"
            " 1024, 1000, 2, 4, '{}', true, now(), now())"
        )
        conn.execute(
            "INSERT INTO submissions (submission_id, user_id, request_hash,"
            " estimated_millicredits, created_at) VALUES ('s', 'u0000001', 'h', 0, now())"
        )
        conn.execute(
            "INSERT INTO processing_jobs (job_id, submission_id, user_id, object_id,"
            " profile_id, operation, queue, priority, status, params,"
            " estimated_millicredits, attempt_count, max_attempts, cancel_requested,"
            " created_at, updated_at) SELECT 'j' || lpad(n::text, 7, '0'), 's', 'u0000001',"
            " 'o1', 1, 'ocr', 'ocr', 4, CASE WHEN n %% 10 = 1 THEN 'queued' ELSE"
            " 'completed' END, '{}', 1000 + n, 0, 2, false, now(), now()"
            " FROM generate_series(1, %s) n",
            (jobs,),
        )
        conn.execute("VACUUM ANALYZE")


@dataclass
class _Beside:
    """What :func:`_migrate_beside_writes` saw."""

    # The statements seen reading the table's rows while the migration held a lock on
    # it that stops its writes ("<mode>: <statement>").
    held: set[str] = field(default_factory=set)
    gave_up: list[str] = field(default_factory=list)  # writes that waited 1.5 s
    outcome: list[BaseException | None] = field(default_factory=list)  # None: done
    writes: int = 0  # written while the migration ran or the held write was open
    longest: float = 0.0  # the longest write's seconds
    in_flight_waited: float | None = None  # how long the held write waited
    started_writing: bool = False


def _migrate_beside_writes(
    engine: Engine, run, table_name: str, in_flight_write: str, write: str
) -> _Beside:
    """Run ``run`` (a migration) in a thread, watching the locks its session holds on
    ``table_name`` (pg_locks, every few ms). Once it is seen running a statement that
    reads the table's rows (:func:`_reads_rows`), ``in_flight_write`` is begun on
    another connection and held open 2 s (lock_timeout 1.5 s), while a third writes
    ``write`` (its ``{n}`` the writes made so far) every 10 ms (lock_timeout 1.5 s)
    until both have ended. Says what
    was seen (:class:`_Beside`)."""
    import threading
    import time

    import psycopg

    seen = _Beside()
    done = threading.Event()
    started_writing = threading.Event()
    held_over = threading.Event()

    def migration() -> None:
        try:
            run()
            seen.outcome.append(None)
        except BaseException as exc:
            seen.outcome.append(exc)
        finally:
            done.set()

    with (
        _pg_autocommit(engine) as watcher,
        _pg_autocommit(engine) as in_flight,
        _pg_autocommit(engine) as writer,
    ):
        ours = [c.info.backend_pid for c in (watcher, in_flight, writer)]
        for conn in (in_flight, writer):
            conn.execute("SET lock_timeout = '1500ms'")

        def hold() -> None:
            began = time.monotonic()
            try:
                with in_flight.transaction():
                    in_flight.execute(in_flight_write)
                    seen.in_flight_waited = round(time.monotonic() - began, 3)
                    time.sleep(2.0)
            except psycopg.errors.LockNotAvailable:
                seen.gave_up.append(f"in flight: {time.monotonic() - began:.2f} s")
            finally:
                held_over.set()

        def write_on() -> None:
            while not (done.is_set() and held_over.is_set()):
                began = time.monotonic()
                try:
                    writer.execute(write.replace("{n}", str(seen.writes)))
                except psycopg.errors.LockNotAvailable:
                    seen.gave_up.append(f"{time.monotonic() - began:.2f} s")
                    return
                took = time.monotonic() - began
                seen.longest = max(seen.longest, took)
                seen.writes += 1
                time.sleep(0.01)

        helpers: list[threading.Thread] = []
        thread = threading.Thread(target=migration, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < deadline:
            rows = watcher.execute(
                "SELECT l.mode, a.query FROM pg_locks l JOIN pg_stat_activity a"
                " ON a.pid = l.pid WHERE l.locktype = 'relation' AND l.granted"
                " AND l.relation = to_regclass(%s) AND a.datname = current_database()"
                " AND l.pid <> ALL(%s)",
                (table_name, ours),
            ).fetchall()
            for mode, query in rows:
                if not _reads_rows(query or "", table_name):
                    continue
                if mode in _STOPS_WRITES:
                    seen.held.add(f"{mode}: {' '.join(query.split())[:70]}")
                if not started_writing.is_set():
                    started_writing.set()
                    helpers = [threading.Thread(target=f, daemon=True) for f in (hold, write_on)]
                    for helper in helpers:
                        helper.start()
            time.sleep(0.002)
        thread.join(60)
        for helper in helpers:
            helper.join(30)
    seen.longest = round(seen.longest, 3)
    seen.started_writing = started_writing.is_set()
    return seen


def test_0013_builds_and_checks_processing_jobs_beside_job_writes(
    revisions, pg_server, monkeypatch
):
    """0013 added processing_jobs.bulk_run_id, its foreign key (checked against every
    job) and two indexes on it (plain builds) in one transaction: ADD COLUMN's ACCESS
    EXCLUSIVE lock on processing_jobs was held while every job was read three times,
    and every submit, claim and completion (and read of a job) waited (1M jobs:
    1.4-1.8 s).
    On PostgreSQL the column and the key (NOT VALID) are a moment's transaction, then
    the key is validated and the indexes built concurrently: a job write begun while
    they read the table is written at once and held open 2 s (the builds wait for it),
    and the jobs written every 10 ms meanwhile never wait (old: the builds and the
    key's check seen under ACCESS EXCLUSIVE)."""
    monkeypatch.setattr(migrate, "LOCK_TIMEOUT_SECONDS", 3.0, raising=False)
    monkeypatch.setattr(migrate, "LOCK_ATTEMPTS", 1, raising=False)
    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, "0012")
        _seed_jobs(engine, 100_000)
        seen = _migrate_beside_writes(
            engine,
            lambda: migrate.upgrade(engine, "0013"),
            "processing_jobs",
            "UPDATE processing_jobs SET priority = 1 WHERE job_id = 'j0000001'",
            "UPDATE processing_jobs SET priority = 1 WHERE job_id = 'j0100000'",
        )
        assert seen.held == set(), seen
        assert seen.gave_up == [] and seen.outcome == [None], seen
        assert seen.started_writing and seen.in_flight_waited is not None, seen
        assert seen.in_flight_waited < 1.0 and seen.writes > 20, seen
        assert migrate.current_revision(engine) == "0013"
        with _pg_autocommit(engine) as check:
            key = check.execute(
                "SELECT convalidated FROM pg_constraint"
                " WHERE conname = 'fk_processing_jobs_bulk_run_id_bulk_runs'"
            ).fetchall()
            valid = dict(
                check.execute(
                    "SELECT c.relname, i.indisvalid FROM pg_index i"
                    " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname IN"
                    " ('uk_jobs_bulk_run_object', 'ix_jobs_bulk_run_status')"
                ).fetchall()
            )
        assert key == [(True,)]
        assert valid == {"uk_jobs_bulk_run_object": True, "ix_jobs_bulk_run_status": True}
        migrate.upgrade(engine)
        assert schema_diffs(engine) == []
    finally:
        engine.dispose()
        pg_server.drop_database(name)


def test_0013_cut_short_after_its_first_transaction_is_finished_by_the_next_upgrade(
    revisions,
    pg_server,
):
    """On PostgreSQL 0013 commits its table, columns and NOT VALID foreign key before it
    validates the key and builds the indexes: a run that ended there (a killed process,
    a cancelled build) left them in place at revision 0012, and the next upgrade failed
    on them (old: 'relation "bulk_runs" already exists'). It validates the key, builds
    the indexes and goes on."""
    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, "0013")
        with _pg_autocommit(engine) as conn:  # as 0013 leaves it when cut short there
            conn.execute("DROP INDEX uk_jobs_bulk_run_object")
            conn.execute("DROP INDEX ix_jobs_bulk_run_status")
            conn.execute(
                "UPDATE pg_constraint SET convalidated = false"
                " WHERE conname = 'fk_processing_jobs_bulk_run_id_bulk_runs'"
            )
            conn.execute("UPDATE alembic_version SET version_num = '0012'")
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert schema_diffs(engine) == []
        with _pg_autocommit(engine) as conn:
            key = conn.execute(
                "SELECT convalidated FROM pg_constraint"
                " WHERE conname = 'fk_processing_jobs_bulk_run_id_bulk_runs'"
            ).fetchall()
            indexes = conn.execute(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE i.indisvalid AND c.relname IN"
                " ('uk_jobs_bulk_run_object', 'ix_jobs_bulk_run_status')"
            ).fetchall()
        assert key == [(True,)] and len(indexes) == 2
    finally:
        engine.dispose()
        pg_server.drop_database(name)


def test_0015_fills_stored_bytes_beside_uploads(revisions, pg_server, monkeypatch):
    """0015 added users.stored_bytes and filled it, a sum of every live object, in the
    column's transaction: its ACCESS EXCLUSIVE lock on users was held for the whole
    sum, and every authentication, upload and submit (their foreign keys lock the
    user's row) waited for it (2M objects, 10k users: 1.7-3.2 s). On PostgreSQL the
    column is committed first and the users filled in batches, each holding only its
    rows: a write of a user's row begun while the fill runs is written at once and held
    open 2 s, and the uploads made every 10 ms meanwhile never wait (old: the fill seen
    under ACCESS EXCLUSIVE); every user's count is its live objects' bytes."""
    monkeypatch.setattr(migrate, "LOCK_TIMEOUT_SECONDS", 3.0, raising=False)
    monkeypatch.setattr(migrate, "LOCK_ATTEMPTS", 1, raising=False)
    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, "0014")
        _seed_jobs(engine, 1, users=5_000, objects=200_000)
        with _pg_autocommit(engine) as conn:
            conn.execute("UPDATE objects SET deleted_at = now() WHERE object_id LIKE '%7'")
        seen = _migrate_beside_writes(
            engine,
            lambda: migrate.upgrade(engine, "0015"),
            "users",
            "UPDATE users SET name = 'held' WHERE user_id = 'u0000001'",
            _OBJECT.replace("'u'", "'u0005000'")  # an upload of 0 bytes, counted or not
            .replace("%s, 'p'", "'new{n}', 'p'")
            .replace("%s, 'f', 1", "'new{n}', 'f', 0"),
        )
        assert seen.held == set(), seen
        assert seen.gave_up == [] and seen.outcome == [None], seen
        assert seen.started_writing and seen.in_flight_waited is not None, seen
        assert seen.in_flight_waited < 1.0 and seen.writes > 20, seen
        assert migrate.current_revision(engine) == "0015"
        with _pg_autocommit(engine) as check:
            wrong = check.execute(
                "SELECT u.user_id, u.stored_bytes, coalesce(sum(o.size_bytes), 0)"
                " FROM users u LEFT JOIN objects o ON o.owner_id = u.user_id"
                " AND o.deleted_at IS NULL"
                " GROUP BY u.user_id HAVING u.stored_bytes <> coalesce(sum(o.size_bytes), 0)"
            ).fetchall()
            users = check.execute("SELECT count(*) FROM users WHERE stored_bytes > 0").fetchone()
        assert wrong == [] and users is not None and users[0] > 4_000
        migrate.upgrade(engine)
        assert schema_diffs(engine) == []
    finally:
        engine.dispose()
        pg_server.drop_database(name)


def test_0015_cut_short_after_its_column_is_finished_by_the_next_upgrade(revisions, pg_server):
    """On PostgreSQL 0015 commits users.stored_bytes before it fills it: a run that ended
    part way left the column, some users filled, at revision 0014, and the next upgrade
    failed on it (old: column "stored_bytes" of relation "users" already exists). It
    fills every user and goes on."""
    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, "0014")
        _seed_jobs(engine, 1, users=3, objects=30)
        with _pg_autocommit(engine) as conn:  # as 0015 leaves it when cut short
            conn.execute("ALTER TABLE users ADD COLUMN stored_bytes BIGINT DEFAULT 0 NOT NULL")
            conn.execute("UPDATE users SET stored_bytes = 999 WHERE user_id = 'u0000001'")
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert schema_diffs(engine) == []
        with _pg_autocommit(engine) as conn:
            stored = dict(conn.execute("SELECT user_id, stored_bytes FROM users").fetchall())
        # objects n = 1..30 belong to user n % 3 + 1 and are n bytes
        assert stored == {
            f"u000000{u}": sum(n for n in range(1, 31) if n % 3 + 1 == u) for u in (1, 2, 3)
        }
    finally:
        engine.dispose()
        pg_server.drop_database(name)


def test_0018_fills_the_live_jobs_reservations_beside_job_writes(revisions, pg_server, monkeypatch):
    """0018 added processing_jobs.reserved_millicredits and filled the live jobs' rows
    in the column's transaction: its ACCESS EXCLUSIVE lock on processing_jobs was held
    for the whole fill, and every submit, claim and completion (and read of a job)
    waited for it (1M jobs, 100k live: 3.1-3.3 s). On PostgreSQL the column is committed
    first and the live jobs filled in batches, each holding only its rows: a live job's
    write begun while the fill runs is written at once and held open 2 s, and the job
    writes every 10 ms meanwhile never wait (old: the fill seen under ACCESS
    EXCLUSIVE); each live job reserves its estimate, each ended one nothing."""
    monkeypatch.setattr(migrate, "LOCK_TIMEOUT_SECONDS", 3.0, raising=False)
    monkeypatch.setattr(migrate, "LOCK_ATTEMPTS", 1, raising=False)
    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, "0017")
        _seed_jobs(engine, 100_000)
        seen = _migrate_beside_writes(
            engine,
            lambda: migrate.upgrade(engine, "0018"),
            "processing_jobs",
            "UPDATE processing_jobs SET priority = 1 WHERE job_id = 'j0000001'",
            "UPDATE processing_jobs SET priority = 1 WHERE job_id = 'j0099991'",
        )
        assert seen.held == set(), seen
        assert seen.gave_up == [] and seen.outcome == [None], seen
        assert seen.started_writing and seen.in_flight_waited is not None, seen
        assert seen.in_flight_waited < 1.0 and seen.writes > 20, seen
        assert migrate.current_revision(engine) == "0018"
        with _pg_autocommit(engine) as check:
            reserved = check.execute(
                "SELECT status, count(*), count(*) FILTER (WHERE reserved_millicredits ="
                " CASE status WHEN 'queued' THEN estimated_millicredits ELSE 0 END)"
                " FROM processing_jobs GROUP BY status ORDER BY status"
            ).fetchall()
        assert reserved == [("completed", 90_000, 90_000), ("queued", 10_000, 10_000)]
        migrate.upgrade(engine)
        assert schema_diffs(engine) == []
    finally:
        engine.dispose()
        pg_server.drop_database(name)


def test_0018_cut_short_after_its_column_is_finished_by_the_next_upgrade(revisions, pg_server):
    """On PostgreSQL 0018 commits processing_jobs.reserved_millicredits (without its
    default) before it fills the live jobs: a run that ended part way left the column,
    some jobs filled, at revision 0017, and the next upgrade failed on it (old: column
    "reserved_millicredits" of relation "processing_jobs" already exists). It fills
    every live job and goes on."""
    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, "0017")
        _seed_jobs(engine, 30)
        with _pg_autocommit(engine) as conn:  # as 0018 leaves it when cut short
            conn.execute(
                "ALTER TABLE processing_jobs ADD COLUMN reserved_millicredits BIGINT"
                " DEFAULT 0 NOT NULL"
            )
            conn.execute("ALTER TABLE processing_jobs ALTER reserved_millicredits DROP DEFAULT")
            conn.execute(
                "UPDATE processing_jobs SET reserved_millicredits = estimated_millicredits"
                " WHERE job_id = 'j0000001'"
            )
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert schema_diffs(engine) == []
        with _pg_autocommit(engine) as conn:
            reserved = dict(
                conn.execute("SELECT job_id, reserved_millicredits FROM processing_jobs")
            )
        # job n (estimate 1000 + n) is live when n % 10 == 1
        assert reserved == {f"j{n:07d}": 1000 + n if n % 10 == 1 else 0 for n in range(1, 31)}
    finally:
        engine.dispose()
        pg_server.drop_database(name)


def test_a_stack_opened_on_a_database_that_is_down_is_told_so(settings, tmp_path):
    """Every command that opens the stack reads the schema's revision first: with
    PostgreSQL down, `hypermedia status` said 'error: internal: OperationalError:
    (psycopg.OperationalError) ...' (an unexpected error, SQLAlchemy's words). It is
    DatabaseUnavailable (the CLI: 'error: database_unavailable: database unreachable:
    ...'), the password nowhere in it."""
    from hypermedia.embedded import free_port
    from hypermedia.errors import DatabaseUnavailable
    from hypermedia.stack import Stack

    url = f"postgresql://hm:pw-never-shown@127.0.0.1:{free_port()}/hm"
    down = make_engine(url)
    try:
        with pytest.raises(DatabaseUnavailable, match="database unreachable") as raised:
            migrate.current_revision(down)
        with pytest.raises(DatabaseUnavailable, match="database unreachable"):
            Stack.open(settings(database_url=url), with_storage=False)
    finally:
        down.dispose()
    assert "pw-never-shown" not in str(raised.value)


def test_a_database_host_that_does_not_resolve_is_unreachable():
    """A misspelt host name in the database URL: `hypermedia db upgrade` (and every
    command) said 'error: internal: OperationalError: (psycopg.OperationalError) failed
    to resolve host ...' and SQLAlchemy's background link. It is DatabaseUnavailable like
    any server that cannot be reached, the password nowhere in it."""
    from hypermedia.errors import DatabaseUnavailable

    down = make_engine("postgresql://hm:pw-never-shown@no-such-host.invalid/hm")
    try:
        with pytest.raises(DatabaseUnavailable, match="database unreachable") as raised:
            migrate.current_revision(down)
    finally:
        down.dispose()
    assert "no-such-host.invalid" in str(raised.value)
    assert "pw-never-shown" not in str(raised.value)


def test_a_record_with_jobs_upgrades_from_the_first_revision_and_back(empty_engine):
    """On SQLite, Alembic's batch mode changes a table it cannot alter in place (0013
    adds a foreign key to processing_jobs; downgrades drop columns) by copying it,
    dropping it and renaming the copy. With foreign keys on, dropping a table that
    other rows refer to failed: 'FOREIGN KEY constraint failed' for every embedded
    record with a job that had an attempt, upgraded from any revision before 0013, and
    downgrades past 0013, 0011, 0005, 0003 likewise. Now a migration runs with them
    off and checks them before it commits (SQLite's documented procedure): every row
    stays, the schema is the models', and foreign keys hold again afterwards."""
    migrate.upgrade(empty_engine, "0001")
    moment = to_datetime(1_800_000_000.0)
    job = {
        "submission_id": "s",
        "user_id": "u",
        "object_id": "o",
        "profile_id": 1,
        "operation": "thumbnail",
        "queue": "images",
        "priority": 2,
        "params": "{}",
        "estimated_millicredits": 100,
        "max_attempts": 3,
        "cancel_requested": False,
        "created_at": moment,
        "updated_at": moment,
    }
    rows = {
        "users": [{"user_id": "u", "name": "ann", "is_operator": False, "created_at": moment}],
        "pools": [{"pool_id": "p", "name": "p", "created_at": moment}],
        "objects": [
            {
                "object_id": object_id,
                "pool_id": "p",
                "owner_id": "u",
                "kind": kind,
                "storage_key": object_id,
                "filename": "f",
                "size_bytes": 10,
                "created_at": moment,
            }
            for object_id, kind in (("o", "original"), ("d", "derived"))
        ],
        "processing_profiles": [
            {
                "operation": "thumbnail",
                "version": 1,
                "queue": "images",
                "base_cost_millicredits": 100,
                "cost_per_mb_millicredits": 0,
                "timeout_seconds": 30,
                "memory_limit_mb": 1024,
                "max_input_bytes": 1000,
                "max_attempts": 3,
                "default_priority": 2,
                "params": "{}",
                "active": True,
                "created_at": moment,
                "updated_at": moment,
            }
        ],
        "submissions": [
            {
                "submission_id": "s",
                "user_id": "u",
                "request_hash": "h",
                "estimated_millicredits": 200,
                "created_at": moment,
            }
        ],
        "processing_jobs": [
            {**job, "job_id": "done", "status": "completed", "attempt_count": 1},
            {**job, "job_id": "running", "status": "processing", "attempt_count": 1},
        ],
        "job_attempts": [
            {
                "job_id": job_id,
                "attempt_number": 1,
                "worker_id": "w",
                "status": status,
                "started_at": moment,
            }
            for job_id, status in (("done", "succeeded"), ("running", "running"))
        ],
        "job_outputs": [
            {
                "job_id": "done",
                "output_type": "thumbnail",
                "profile_version": 1,
                "object_id": "d",
                "storage_key": "d",
                "size_bytes": 10,
                "created_at": moment,
            }
        ],
        "credit_ledger": [
            {
                "user_id": "u",
                "job_id": "done",
                "kind": "charge",
                "amount_millicredits": -100,
                "note": "thumbnail",
                "created_at": moment,
            }
        ],
    }
    with empty_engine.begin() as conn:
        for name, values in rows.items():
            conn.execute(insert(table(name, *(column(key) for key in values[0]))), values)

    def counts() -> dict[str, int]:
        with empty_engine.connect() as conn:
            return {
                name: len(conn.execute(select(table(name, column(next(iter(values[0])))))).all())
                for name, values in rows.items()
            }

    expected = {name: len(values) for name, values in rows.items()}
    migrate.upgrade(empty_engine)
    assert counts() == expected
    assert schema_diffs(empty_engine) == []
    migrate.downgrade(empty_engine, "0001")
    assert counts() == expected
    migrate.upgrade(empty_engine)
    assert counts() == expected
    assert schema_diffs(empty_engine) == []
    orphan = table("job_attempts", *(column(key) for key in rows["job_attempts"][0]))
    with pytest.raises(IntegrityError), empty_engine.begin() as conn:
        conn.execute(insert(orphan), [{**rows["job_attempts"][0], "job_id": "none"}])


# A process that waits for a file to appear, then migrates and syncs the profiles (what
# `hypermedia db upgrade`, `up` and `run` do as they start).
_MIGRATE_WHEN_TOLD = """
import sys, time
from pathlib import Path
from hypermedia.config import load_settings
from hypermedia.db.upgrade import migrate
while not Path(sys.argv[1]).exists():
    time.sleep(0.005)
try:
    migrate(load_settings())
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


def test_two_processes_migrating_at_once_take_turns(pg_server, tmp_path):
    """Two heads started at once on an empty PostgreSQL database (`db upgrade` beside an
    `up`): the second's CREATE TABLE waited for the first's, then failed ('duplicate key
    value violates unique constraint "pg_type_typname_nsp_index"', 3 runs of 3), and two
    syncing the same new profile version, one of them on uk_profile_operation_version.
    Now each migration and profile sync holds an advisory lock: both succeed, the second
    finding nothing left to do."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    name = support.unique_name("mig")
    url = pg_server.create_database(name)
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")}
    env.update(
        HYPERMEDIA_DATABASE_URL=url,
        HYPERMEDIA_DATA_DIR=str(tmp_path / "data"),
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )
    engine = make_engine(url)
    try:
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", _MIGRATE_WHEN_TOLD, str(go)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(2)
        ]
        go.touch()
        outputs = [process.communicate(timeout=120)[0] for process in processes]
        assert outputs == ["", ""], outputs
        assert [process.returncode for process in processes] == [0, 0]
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert schema_diffs(engine) == []
        profiles = table("processing_profiles", column("operation"), column("version"))
        with engine.connect() as conn:
            rows = conn.execute(select(profiles.c.operation, profiles.c.version)).all()
        assert rows and len(rows) == len(set(rows))
    finally:
        engine.dispose()
        pg_server.drop_database(name)


def test_another_applications_database_is_said_to_be_one(empty_engine, settings):
    """`hypermedia db upgrade` on a database of another application's with a `users`
    table of its own: Alembic's CREATE TABLE users failed, 'error: internal:
    ProgrammingError: (psycopg.errors.DuplicateTable) relation "users" already exists'
    and 12 more lines of SQL, after `status` had told the operator to run it ('no schema
    yet'). One migrated by another application's Alembic was said to be migrated by a
    newer hypermedia. Each is refused, naming what was found, and nothing is touched."""
    from sqlalchemy import text

    from hypermedia.cli.common import open_engine
    from hypermedia.db.upgrade import migrate as stack_migrate
    from hypermedia.errors import ConfigError

    configured = settings(database_url=empty_engine.url.render_as_string(hide_password=False))
    with empty_engine.begin() as conn:
        conn.execute(text("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)"))
    for attempt in (
        lambda: stack_migrate(configured, empty_engine),
        lambda: open_engine(configured),
    ):
        with pytest.raises(ConfigError) as raised:
            attempt()
        assert "tables named as hypermedia's (users): another application's database" in str(
            raised.value
        )
    assert set(inspect(empty_engine).get_table_names()) == {"users"}

    with empty_engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(text("INSERT INTO alembic_version VALUES ('ae1027a6acf')"))
    for attempt in (
        lambda: stack_migrate(configured, empty_engine),
        lambda: open_engine(configured),
    ):
        with pytest.raises(ConfigError) as raised:
            attempt()
        message = str(raised.value)
        assert "at revision ae1027a6acf and has no job record" in message, message
        assert "newer hypermedia" not in message
    assert set(inspect(empty_engine).get_table_names()) == {"users", "alembic_version"}


def test_an_objects_outputs_are_found_by_an_index(revisions, empty_engine):
    """0026: a deletion walks everything derived from an object by source_object_id
    (a step per generation); unindexed, each step read the whole table (400k objects
    on PostgreSQL: 110 ms a step, 1.9 ms with the index)."""
    revisions.bring(empty_engine)

    def indexed() -> list[list[str | None]]:
        return [i["column_names"] for i in inspect(empty_engine).get_indexes("objects")]

    assert ["source_object_id"] in indexed()
    migrate.downgrade(empty_engine, "0025")
    assert ["source_object_id"] not in indexed()


def test_copies_of_objects_deleted_before_0029_are_recorded_for_the_sweep(revisions, empty_engine):
    """0029: a deletion deletes the copy a bulk migrate made on another backend; the
    objects deleted before it had theirs left there (billed, never read): each is
    recorded, due at once, with its backend. A live migrated object and a deleted one
    never migrated are not."""

    revisions.bring(empty_engine, "0028")
    moment = to_datetime(1_800_000_000.0)
    row = {"pool_id": "p", "owner_id": "u", "kind": "original", "filename": "f"}
    with empty_engine.begin() as conn:
        conn.execute(
            insert(t.users),
            [{"user_id": "u", "name": "u", "is_operator": False, "created_at": moment}],
        )
        conn.execute(insert(t.pools), [{"pool_id": "p", "name": "p", "created_at": moment}])
        conn.execute(
            insert(t.objects),
            [
                {**row, "object_id": o, "storage_key": f"k-{o}", "size_bytes": 1,
                 "created_at": moment, "deleted_at": deleted, "storage_backend": backend}
                for o, deleted, backend in (
                    ("gone", moment, "s3:archive"),
                    ("live", None, "s3:archive"),
                    ("plain", moment, None),
                )
            ],
        )  # fmt: skip
    migrate.upgrade(empty_engine)
    d = t.blob_deletions.c
    with empty_engine.begin() as conn:
        recorded = conn.execute(
            select(d.storage_key, d.object_id, d.storage_backend, d.attempts, d.next_attempt_at)
        ).all()
    assert [tuple(r) for r in recorded] == [("k-gone", "gone", "s3:archive", 0, moment)]


def test_deletions_recorded_before_0029_and_pending_have_their_copies_deleted(
    revisions, empty_engine, tmp_path
):
    """0029 recorded the copies of objects deleted before it that had no record left,
    but a deletion code before 0029 recorded (no backend: the column was not there)
    and still pending when 0029 ran (a try the storage failed, a sweep not yet due) kept
    no backend: the sweep deleted the key from the server's storage only, and the copy
    a bulk migrate had made on its target stayed there for good. The deleter takes the
    backend from the deleted object's row now (old: both copies left in the target). A
    record whose row is live again (its key written anew) still deletes nothing."""
    revisions.bring(empty_engine, "0028")
    moment = to_datetime(1_800_000_000.0 - 7200)
    row = {"pool_id": "p", "owner_id": "u", "kind": "original", "filename": "f"}
    keys = {o: original_key("p", o) for o in ("failed", "unswept", "plain", "revived")}
    server, archive = LocalStorage(tmp_path / "server"), LocalStorage(tmp_path / "archive")
    with empty_engine.begin() as conn:
        conn.execute(
            insert(t.users),
            [{"user_id": "u", "name": "u", "is_operator": False, "created_at": moment}],
        )
        conn.execute(insert(t.pools), [{"pool_id": "p", "name": "p", "created_at": moment}])
        conn.execute(
            insert(t.objects),
            [
                {**row, "object_id": o, "storage_key": keys[o], "size_bytes": 1,
                 "created_at": moment, "deleted_at": deleted, "storage_backend": backend}
                for o, deleted, backend in (
                    ("failed", moment, "local:archive"),
                    ("unswept", moment, "local:archive"),
                    ("plain", moment, None),
                    ("revived", None, "local:archive"),
                )
            ],
        )  # fmt: skip
        # The records as code before 0029 wrote them (deletions.record, _failed).
        old_records = table(
            "blob_deletions",
            *map(column, ("storage_key", "object_id", "requested_at", "attempts",
                          "next_attempt_at", "last_error", "claimed_until")),
        )  # fmt: skip
        conn.execute(
            insert(old_records),
            [
                {"storage_key": keys[o], "object_id": o, "requested_at": moment,
                 "attempts": attempts, "next_attempt_at": to_datetime(1_800_000_000.0 - 60),
                 "last_error": error, "claimed_until": None}
                for o, attempts, error in (
                    ("failed", 3, "deleting: timed out"),
                    ("unswept", 0, None),
                    ("plain", 1, "deleting: timed out"),
                    ("revived", 0, None),
                )
            ],
        )  # fmt: skip
    for key in keys.values():
        server.put(key, [b"bytes"])
        archive.put(key, [b"bytes"])
    migrate.upgrade(empty_engine)
    report = deletions.sweep(
        empty_engine,
        server,
        ManualClock(1_800_000_000.0),
        backends={"local:archive": archive}.__getitem__,
    )
    assert sorted(report.deleted) == sorted(keys[o] for o in ("failed", "unswept", "plain"))
    assert report.revived == [keys["revived"]]
    assert [o for o, key in keys.items() if server.exists(key)] == ["revived"]
    assert [o for o, key in keys.items() if archive.exists(key)] == ["plain", "revived"]
    with empty_engine.begin() as conn:
        assert conn.execute(select(t.blob_deletions.c.storage_key)).all() == []


def test_0029_scans_objects_without_holding_blob_deletions(revisions, pg_server):
    """0029 added blob_deletions.storage_backend and recorded the copies of objects
    deleted before it in one transaction: the column's ACCESS EXCLUSIVE lock on
    blob_deletions was held for the whole scan of objects (1.3-2.0 s on 2M objects),
    and every output URL granted (being_deleted reads it), object deleted and blob
    swept waited for it. On PostgreSQL the column is committed first: no such lock is
    held while the scan runs (old: seen held by the scan's INSERT), the copies are
    recorded as before, and a run cut short after the column is finished by the next
    upgrade."""
    import threading
    import time

    name = support.unique_name("mig")
    engine = make_engine(pg_server.create_database(name))
    try:
        revisions.bring(engine, "0028")
        with _pg_autocommit(engine) as conn:
            conn.execute("INSERT INTO users VALUES ('u', 'u', false, now(), 0)")
            conn.execute("INSERT INTO pools VALUES ('p', 'p', now())")
            conn.execute(  # 30k deleted objects migrated to a bucket, 30k live ones
                "INSERT INTO objects (object_id, pool_id, owner_id, kind, storage_key,"
                " filename, size_bytes, created_at, deleted_at, storage_backend)"
                " SELECT 'o' || g, 'p', 'u', 'original', 'k-' || g, 'f', 1, now(),"
                " CASE WHEN g % 2 = 0 THEN now() END, 's3:archive'"
                " FROM generate_series(1, 60000) g"
            )
            conn.execute("ANALYZE objects")
        done = threading.Event()
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                migrate.upgrade(engine, "0029")
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)
            finally:
                done.set()

        held_while_scanning = 0
        with _pg_autocommit(engine) as watcher:
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            while not done.wait(0.002):
                held_while_scanning += watcher.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE l.relation = to_regclass('blob_deletions') AND l.granted"
                    " AND l.mode = 'AccessExclusiveLock' AND a.state = 'active'"
                    " AND a.query LIKE 'INSERT INTO blob_deletions%%'"
                ).fetchone()[0]
            thread.join(30)
        assert outcome == [None], outcome
        assert held_while_scanning == 0, "blob_deletions was held exclusively by the scan"
        with _pg_autocommit(engine) as conn:
            recorded = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE storage_backend = 's3:archive'"
                " AND attempts = 0) FROM blob_deletions"
            ).fetchone()
            assert recorded == (30_000, 30_000)
            # Cut short after the column was committed: the next upgrade finishes it.
            conn.execute("DELETE FROM alembic_version")
            conn.execute("INSERT INTO alembic_version VALUES ('0028')")
            conn.execute("DELETE FROM blob_deletions WHERE storage_key LIKE 'k-1%%'")
        started = time.monotonic()
        migrate.upgrade(engine, "0029")
        assert time.monotonic() - started < 10
        with _pg_autocommit(engine) as conn:
            assert conn.execute("SELECT count(*) FROM blob_deletions").fetchone() == (30_000,)
    finally:
        engine.dispose()
        pg_server.drop_database(name)


def test_a_ledger_with_a_job_charged_twice_is_refused_by_0030_naming_it(
    engine, settings, manual_clock
):
    """0030 makes one charge per job a rule of credit_ledger (a unique index on the charge
    entries' job_id). A ledger holding a job charged twice already is refused, naming
    the job and its entries, and left as it was (at 0029, both entries there) rather
    than failing on the index's creation (a bare unique violation naming no job); once
    one entry is gone it upgrades. Grants and removals, which name no job, never
    collide."""
    from hypermedia.accounts import grant_credits
    from hypermedia.errors import HypermediaError
    from tests.factories import make_user, open_stack, submit

    stack = open_stack(settings, engine, manual_clock)
    alice = make_user(stack, credits=10)
    submit(stack, alice, ["thumbnail"])
    (job,) = stack.dispatcher.claim("images", "w")
    assert stack.dispatcher.start(job, "w")
    assert stack.dispatcher.complete(job, "w")
    with engine.begin() as conn:
        for amount in (5, -3, 5):
            grant_credits(conn, alice.caller.user_id, amount, manual_clock.now())
    stack.close()
    migrate.downgrade(engine, "0029")
    c = t.credit_ledger.c
    with engine.begin() as conn:
        (first,) = conn.execute(select(t.credit_ledger).where(c.kind == "charge")).all()
        again = {k: v for k, v in first._mapping.items() if k != "entry_id"}
        second = conn.execute(
            insert(t.credit_ledger).values(**again).returning(c.entry_id)
        ).scalar_one()
    with pytest.raises(HypermediaError) as refused:
        migrate.upgrade(engine)
    message = refused.value.message
    assert f"{job.job_id}: entries {first.entry_id}, {second}" in message
    assert "1 job(s) are charged more than once" in message and "0030 made no change" in message
    assert refused.value.details == {"job_ids": [job.job_id]}
    assert migrate.current_revision(engine) == "0029"
    names = {i["name"] for i in inspect(engine).get_indexes("credit_ledger")}
    assert "uk_credit_ledger_job_charge" not in names
    with engine.begin() as conn:
        assert len(conn.execute(select(c.entry_id).where(c.kind == "charge")).all()) == 2
        conn.execute(t.credit_ledger.delete().where(c.entry_id == second))
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert schema_diffs(engine) == []
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(t.credit_ledger).values(**again))


def test_a_first_migration_committed_between_the_checks_reads_as_hypermedias(pg_server):
    """A second head starting beside the first read the revision (none yet), then the
    table names, which the first's first migration had committed meanwhile (with its
    revision): 'the database has no hypermedia schema but tables named as hypermedia's:
    another application's database?' (CI, once). The names are read first now: tables
    seen mean their revision is seen after them. The first's commit is made to land
    right after the check's first statement, whichever it reads."""
    from sqlalchemy import event, text

    name = support.unique_name("mig")
    url = pg_server.create_database(name)
    first = make_engine(url)
    second = make_engine(url)
    try:
        base = next(rev for rev, down in migrate._read_down_revisions().items() if down is None)
        other = first.connect()
        other.begin()
        other.execute(text("CREATE TABLE processing_jobs (job_id text PRIMARY KEY)"))
        other.execute(text(f"CREATE TABLE {migrate.VERSION_TABLE} (version_num text)"))
        other.execute(text(f"INSERT INTO {migrate.VERSION_TABLE} VALUES ('{base}')"))
        statements: list[str] = []

        @event.listens_for(second, "after_cursor_execute")
        def _first_commits(conn, cursor, statement, parameters, context, executemany):
            statements.append(statement)
            if len(statements) == 1:
                other.commit()

        assert migrate.upgrade_problem(second) is None
        assert len(statements) > 1
        other.close()
    finally:
        first.dispose()
        second.dispose()
        pg_server.drop_database(name)
