"""Errors that cross a process (a Ray actor's, its constructor's) arrive as themselves."""

from __future__ import annotations

from hypermedia.errors import HypermediaError


def test_every_error_crosses_a_process_whole():
    """Pickled (what Ray does to an error an actor raises), every class comes back as
    itself with its message, details and attributes: ConfigError, whose __init__ takes
    a key and a problem, did not unpickle at all (Ray then said only
    ``UnserializableException``)."""
    import pickle

    from hypermedia.errors import ConfigError, _every_class
    from hypermedia.storage.base import StorageUnavailable

    for cls in _every_class():
        error = cls.__new__(cls)
        HypermediaError.__init__(error, f"{cls.__name__} happened", why="because")
        error.http_status = 418
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is cls
        assert (back.message, back.details, back.http_status, str(back)) == (
            error.message,
            error.details,
            418,
            f"{cls.__name__} happened",
        )
    config = pickle.loads(pickle.dumps(ConfigError("database_url", "no schema yet")))
    assert (config.key, config.message, config.code) == (
        "database_url",
        "database_url: no schema yet",
        "config_invalid",
    )
    assert pickle.loads(pickle.dumps(StorageUnavailable("s3 down"))).code == StorageUnavailable.code


def test_an_error_is_found_by_the_last_line_of_its_traceback():
    from hypermedia.errors import ConfigError, from_traceback

    text = (
        "The actor died because of an error raised in its creation task, ray::A.__init__()\n"
        '  File "x.py", line 1, in __init__\n'
        "hypermedia.errors.ConfigError: database_url (HYPERMEDIA_DATABASE_URL): run it\n"
    )
    found = from_traceback(text)
    assert isinstance(found, ConfigError)
    assert found.message == "database_url (HYPERMEDIA_DATABASE_URL): run it"
    assert found.code == "config_invalid"
    assert from_traceback("ValueError: not ours") is None
    assert from_traceback("hypermedia.errors.NoSuchError: x") is None
    assert from_traceback("") is None
