"""Every generated image, and every image of the shared corpus (the corpus tier),
through the HTTP API, on a real Ray cluster, with S3 storage (moto's server over HTTP,
through boto3): each one completes with its output at the deterministic key, decoding
with the requested size and format, or is refused with ``unsupported_format`` (at
submit, from the type detected at upload, or by the worker's pipeline). No other
outcome is acceptable."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import boto3
import pytest
import pyvips
from moto.server import ThreadedMotoServer
from rich.console import Console
from rich.table import Table

from hypermedia.errors import UnsupportedFormat
from hypermedia.ingest.client import HypermediaClient
from hypermedia.storage.base import derived_key
from tests.corpus_support import corpus
from tests.factories import make_user
from tests.generated import Generated
from tests.ray_support import ray_stack

REGION = "us-east-1"
WIDTH, HEIGHT = 200, 150


@pytest.fixture
def moto_s3(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "hypermedia-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hypermedia-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    bucket = f"hm-corpus-{uuid.uuid4().hex[:10]}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION)
    client.create_bucket(Bucket=bucket)
    yield endpoint, bucket, client
    server.stop()


def test_every_generated_image_through_the_api(
    pg_engine, settings, tmp_path, moto_s3, generated: Generated
):
    rows = generated.rows(["images"])
    counts = through_the_api(
        [generated / row.path for row in rows], pg_engine, settings, tmp_path, moto_s3
    )
    # Every image the generator draws is in a supported format, but two on purpose.
    assert counts == {"completed": len(rows) - 2, "unsupported_format": 2}


@pytest.mark.corpus
def test_every_corpus_image_through_the_api(pg_engine, settings, tmp_path, moto_s3):
    files = sorted(p for p in (corpus() / "images").iterdir() if p.is_file())
    assert len(files) >= 80
    counts = through_the_api(files, pg_engine, settings, tmp_path, moto_s3)
    assert counts["completed"] >= 60


def through_the_api(files: list[Path], pg_engine, settings, tmp_path, moto_s3) -> dict[str, int]:
    """Each of ``files`` uploaded and thumbnailed; problems fail the test; the counts of
    the two acceptable outcomes."""
    endpoint, bucket, s3 = moto_s3
    with ray_stack(
        settings,
        pg_engine,
        tmp_path,
        {"images": 1},
        storage_backend="s3",
        s3_bucket=bucket,
        s3_endpoint_url=endpoint,
        s3_region=REGION,
    ) as rs:
        person = make_user(rs.stack)
        assert rs.settings.api_url is not None
        submitted: dict[str, tuple[Path, str]] = {}
        refused: dict[Path, str] = {}
        with HypermediaClient(rs.settings.api_url, person.api_key, timeout=60) as client:
            for path in files:
                obj = client.upload(path)
                try:
                    result = client.process(
                        obj.object_id,
                        ["thumbnail"],
                        params={"thumbnail": {"width": WIDTH, "height": HEIGHT, "format": "png"}},
                    )
                except UnsupportedFormat as exc:
                    refused[path] = exc.message
                    continue
                submitted[result.job_ids[0]] = (path, obj.object_id)
            deadline = time.monotonic() + 600
            views = {}
            while time.monotonic() < deadline:
                views = {job_id: client.job(job_id) for job_id in submitted}
                if all(v.status in ("completed", "failed") for v in views.values()):
                    break
                time.sleep(1)

        table = Table("file", "status", "output / error")
        problems = []
        counts = {"completed": 0, "unsupported_format": len(refused)}
        for path, message in refused.items():
            table.add_row(path.name, "refused at submit", f"unsupported_format: {message}"[:90])
        for job_id, (path, object_id) in submitted.items():
            view = views[job_id]
            if view.status == "completed":
                (output,) = view.outputs
                expected = derived_key(person.pool_id, object_id, 1, output.output_type)
                body = s3.get_object(Bucket=bucket, Key=expected)["Body"].read()
                image = pyvips.Image.new_from_buffer(body, "")
                ok = (
                    output.storage_key == expected
                    and str(image.get("vips-loader")).startswith("png")
                    and image.width <= WIDTH
                    and image.height <= HEIGHT
                )
                detail = f"{output.output_type} {image.width}x{image.height}"
                if not ok:
                    problems.append(f"{path.name}: bad output {detail} at {output.storage_key}")
                counts["completed"] += 1
            elif view.status == "failed" and view.error_code == "unsupported_format":
                detail = f"{view.error_code}: {view.error_message}"
                counts["unsupported_format"] += 1
            else:
                detail = f"{view.status} {view.error_code}: {view.error_message}"
                problems.append(f"{path.name}: {detail}")
            table.add_row(path.name, view.status, detail[:90])
        Console(width=160).print(table)
        print(counts)
        assert problems == []
        assert counts["completed"] + counts["unsupported_format"] == len(files)
        return counts
