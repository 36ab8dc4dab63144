"""``hypermedia db``: the job record's schema, on the database the settings name."""

from __future__ import annotations

import typer

from hypermedia.cli.common import note, read_settings, say

app = typer.Typer(help="The job record's schema.", no_args_is_help=True)


@app.command("upgrade")
def db_upgrade() -> None:
    """Apply migrations and sync the processing profiles."""
    from sqlalchemy import make_url

    from hypermedia.db.engine import settings_engine
    from hypermedia.db.migrate import current_revision
    from hypermedia.db.upgrade import migrate
    from hypermedia.embedded import shown_url

    settings = read_settings()
    engine = settings_engine(settings)
    try:
        migrate(settings, engine)
        revision = current_revision(engine)
    finally:
        engine.dispose()
    shown = shown_url(
        make_url(settings.effective_database_url).render_as_string(hide_password=False)
    )
    say(f"database {shown} is at revision {revision}; profiles synced")
    note("running servers and workers read changed profiles when restarted")
