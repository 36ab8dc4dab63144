"""The ocr queue's fork server imports the OCR libraries before it forks
(pipelines.registry.preload; measured by bench/ocr_preload.py): through the real fork
server, with every sandbox feature still on, job after job completes and reads the
page (a job that hung would end as a timeout, failing the test, not hanging it).
"""

from __future__ import annotations

import json
from pathlib import Path

from hypermedia.sandbox.executor import ChildExecutor
from hypermedia.worker.actor import queue_preload
from pipelines import images, registry
from pipelines.ocr import PRELOAD
from tests.generated import Generated
from tests.ocr_support import cer
from tests.pipelines_for_tests import PRELOAD as TEST_PRELOAD


class Catalog:
    """The two calls queue_preload makes of a ProfileCatalog."""

    queues = {"ocr": "ocr", "thumbnail": "images", "pdf_preview": "documents"}

    def operations(self) -> list[str]:
        return list(self.queues)

    def get(self, operation: str):
        return type("Profile", (), {"queue": self.queues[operation]})


def test_the_ocr_queue_preloads_the_ocr_libraries_only():
    assert registry.preload(["ocr"]) == PRELOAD
    assert registry.preload(["thumbnail", "pdf_preview"]) == images.PRELOAD
    assert queue_preload(Catalog(), "ocr", ("pipelines.registry",)) == (
        "pipelines.registry",
        *PRELOAD,
    )
    assert queue_preload(Catalog(), "images", ("pipelines.registry",)) == (
        "pipelines.registry",
        *images.PRELOAD,
    )


def test_jobs_run_in_the_sandbox_of_a_server_that_preloaded_them(
    generated: Generated, tmp_path: Path
):
    with ChildExecutor(tmp_path / "plain", preload=TEST_PRELOAD, job_cpus=1) as plain:
        expected = plain.capabilities
    preload = queue_preload(Catalog(), "ocr", TEST_PRELOAD)
    truth = (generated / "ocr/clean-page.txt").read_text()
    with ChildExecutor(tmp_path / "preloaded", preload=preload, job_cpus=1) as executor:
        # The libraries' idle threads change how the server forks, not what a job gets
        # (its uid block may differ: other servers of the session claim blocks meanwhile).
        got = executor.capabilities
        assert got.pop("uid_range") and expected.pop("uid_range")
        assert got == expected and not expected["missing"], expected
        for number in range(2):
            job = f"preloaded-{number}"
            source = executor.prepare(job) / "input" / "page.png"
            source.write_bytes((generated / "ocr/clean-page.png").read_bytes())
            result = executor.run(
                job,
                "ocr",
                source,
                {"engines": ["ppocr"], "layout": number == 1},
                timeout_seconds=60,
                memory_limit_mb=4096,
                max_processes=32,
            )
            outputs = {
                o.output_type.rsplit(".", 1)[1]: o.path
                for o in result.outputs
                if o.output_type != registry.USAGE_OUTPUT
            }
            assert cer(outputs["txt"].read_text(encoding="utf-8"), truth).cer <= 0.01
            (page,) = json.loads(outputs["json"].read_text(encoding="utf-8"))["pages"]
            assert page["engine"] == "ppocr"
            executor.cleanup(job)
