"""The operator grants keys their priority range and submit rate with the real CLI:
``user add``, ``user key`` and ``user grant`` (issue 11, item 11)."""

from __future__ import annotations

from pathlib import Path

from hypermedia.accounts import KeyGrants, authenticate, key_id_of
from hypermedia.db.engine import make_engine, transaction
from tests.e2e.test_cli import Cli, cli, upgraded_record  # noqa: F401  (the fixtures)


def _grants(data_dir: Path, api_key: str) -> KeyGrants:
    engine = make_engine(f"sqlite:///{data_dir / 'hypermedia.db'}")
    try:
        with transaction(engine) as conn:
            return authenticate(conn, api_key).grants
    finally:
        engine.dispose()


def test_keys_carry_what_the_operator_granted(cli: Cli, tmp_path: Path) -> None:  # noqa: F811
    data = tmp_path / "data"
    cli.upgrade()
    first = cli.ok("user", "add", "web", "--priority", "1-10", "--submits-per-minute", "0")
    first = first.strip()
    assert _grants(data, first) == KeyGrants(1, 10, 0)

    plain = cli.ok("user", "key", "web").strip()
    assert _grants(data, plain) == KeyGrants()  # the settings' defaults apply
    bulk = cli.ok(
        "user", "key", "web", "--priority", "7-10", HYPERMEDIA_GRANT_SUBMITS_PER_MINUTE="50"
    ).strip()
    assert _grants(data, bulk) == KeyGrants(7, 10, 50)

    shown = cli.ok("user", "grant", key_id_of(plain), "--priority", "2")
    assert "priority 2-2" in shown
    assert _grants(data, plain) == KeyGrants(2, 2, None)
    cli.ok("user", "grant", plain)  # no options: back to the defaults
    assert _grants(data, plain) == KeyGrants()

    assert "empty" in cli.fails("user", "grant", plain, "--priority", "9-3")
    assert "1 to 10" in cli.fails("user", "key", "web", "--priority", "0-3")
    assert "MIN-MAX" in cli.fails("user", "key", "web", "--priority", "high")
    assert "not_found" in cli.fails("user", "grant", "000000000000", "--priority", "5")
