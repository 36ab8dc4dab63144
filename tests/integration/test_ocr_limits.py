"""The ocr step at its limits in the real sandbox (a fork server's child, its rlimits):
a page that libvips cannot decode within the job's memory is ``memory_limit``, as
the image steps report it, not a crash; the worker's next job runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PIL import Image

from hypermedia.sandbox.executor import ChildExecutor
from hypermedia.sandbox.outcome import ChildFailed
from pipelines import registry
from tests.generated import ocr_pages


def _run(executor: ChildExecutor, job_id: str, source: Path, memory_limit_mb: int) -> None:
    workdir = executor.prepare(job_id)
    target = workdir / "input" / source.name
    shutil.copy(source, target)
    try:
        executor.run(
            job_id,
            "ocr",
            target,
            {"engines": ["tesseract"]},
            timeout_seconds=120,
            memory_limit_mb=memory_limit_mb,
            max_processes=32,
        )
    finally:
        executor.cleanup(job_id)


@pytest.mark.timeout(300)
def test_a_page_too_large_for_the_memory_limit_is_memory_limit(tmp_path: Path):
    # 10,000 x 10,000: the largest page max_pixels lets through; 286 MB as RGB.
    page = tmp_path / "large.png"
    Image.new("L", (10_000, 10_000), 255).save(page)
    small = tmp_path / "small.png"
    ocr_pages.clean_page(size=20, margin=20).save(small)
    preload = ("pipelines.registry", *registry.preload(["ocr"]))
    with ChildExecutor(tmp_path / "work", preload=preload, job_cpus=1) as executor:
        with pytest.raises(ChildFailed) as caught:
            _run(executor, "large", page, memory_limit_mb=1024)
        assert caught.value.code == "memory_limit", caught.value
        _run(executor, "small", small, memory_limit_mb=4096)
