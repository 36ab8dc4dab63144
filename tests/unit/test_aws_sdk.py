"""hypermedia.aws_sdk: every boto3 session of a process reads botocore's models through
one loader (read once), while credentials stay each session's own."""

from __future__ import annotations

from hypermedia import aws_sdk


def _loader(session):
    return session._session.get_component("data_loader")


def test_sessions_share_one_loader_and_keep_their_own_credentials(monkeypatch):
    monkeypatch.delenv("AWS_DATA_PATH", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFIRST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "first-secret")
    first = aws_sdk.session()
    first.client("s3", region_name="us-east-1")  # the loader reads the S3 model once
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASECOND")
    second = aws_sdk.session()
    assert _loader(first) is _loader(second)
    first_credentials, second_credentials = first.get_credentials(), second.get_credentials()
    assert first_credentials is not None and second_credentials is not None
    assert first_credentials.access_key == "AKIAFIRST"
    assert second_credentials.access_key == "AKIASECOND"
    client = second.client("s3", region_name="eu-west-1")
    assert client.meta.region_name == "eu-west-1"


def test_a_data_path_of_its_own_gets_a_loader_of_its_own(monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_DATA_PATH", raising=False)
    plain = aws_sdk.session()
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    extra = aws_sdk.session()
    assert _loader(extra) is not _loader(plain)
    assert str(tmp_path) in _loader(extra).search_paths
    assert _loader(aws_sdk.session()) is _loader(extra)
