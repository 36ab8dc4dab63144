"""The public API, pinned (httpx's tests/test_exported_members.py): what the package,
the HTTP client and the pipelines registry export. Adding, removing or renaming one of
these is a decision for the people who call them: change the lists here with it."""

from __future__ import annotations

import inspect
from types import ModuleType

import hypermedia
from hypermedia.ingest import client
from pipelines import registry


def defined_here(module: ModuleType) -> list[str]:
    """The public names ``module`` defines itself (not the modules and names it imports)."""
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not inspect.ismodule(value)
        and getattr(value, "__module__", module.__name__) == module.__name__
    )


def test_the_package_exports_its_version_only():
    """Importing ``hypermedia`` is cheap: it holds no API, only its version."""
    assert hypermedia.__all__ == ["__version__"]
    assert defined_here(hypermedia) == []
    assert isinstance(hypermedia.__version__, str)


def test_the_client_module_exports():
    assert sorted(client.__all__) == ["HypermediaClient", "PREFIX", "error_from_response"]
    assert defined_here(client) == sorted(client.__all__)
    assert client.PREFIX == "/v1/hypermedia"


CLIENT_METHODS = {
    "__init__": ["base_url", "api_key", "timeout", "transport", "retries", "event_streams"],
    "__enter__": [],
    "__exit__": ["exc_type", "exc", "tb"],
    "close": [],
    "upload": ["source", "filename", "pool_id", "content_type", "idempotency_key"],
    "register": ["storage_key", "filename", "size_bytes", "pool_id", "content_type", "sha256"],
    "object": ["object_id"],
    "delete": ["object_id"],
    "process": ["object_id", "operations", "priority", "params", "idempotency_key", "callback_url"],
    "job": ["job_id"],
    "attempt_log": ["job_id", "attempt_number"],
    "list_jobs": [
        "status",
        "operation",
        "object_id",
        "submission_id",
        "created_after",
        "created_before",
        "cursor",
        "limit",
    ],
    "submission": ["submission_id"],
    "output_url": ["job_id", "output_type"],
    "download": ["job_id", "output_type", "to"],
    "output_chunks": ["job_id", "output_type", "chunk_size"],
    "cancel": ["job_id"],
    "wait": ["job_id", "timeout"],
    "events": ["job_id", "last_event_id", "timeout"],
    "credits": [],
    "queues": [],
    "health": [],
}


def test_the_clients_methods_and_their_parameters():
    methods = {
        name: [p for p in inspect.signature(member).parameters if p != "self"]
        for name, member in vars(client.HypermediaClient).items()
        if callable(member)
        and (not name.startswith("_") or name in ("__init__", "__enter__", "__exit__"))
    }
    assert methods == CLIENT_METHODS


def test_the_registry_exports():
    assert sorted(registry.__all__) == [
        "Check",
        "MaxUnits",
        "Output",
        "PipelineError",
        "Step",
        "USAGE_OUTPUT",
        "UnsetParameters",
        "bounded_units",
        "check",
        "check_profile",
        "checkpointing",
        "get",
        "load_all",
        "max_units",
        "operations",
        "preload",
        "profile_only",
        "register",
        "register_max_units",
        "usage_output",
    ]
    assert set(defined_here(registry)) <= set(registry.__all__)
    for name in registry.__all__:
        assert hasattr(registry, name), name


def test_the_registered_operations():
    """The operations the pipelines implement (steps the tests register are named
    ``test.*``)."""
    assert [op for op in registry.operations() if not op.startswith("test.")] == [
        "compress",
        "convert",
        "docx_to_pdf",
        "extract_text",
        "ocr",
        "pdf_preview",
        "resize",
        "thumbnail",
        "transcode_audio",
        "transcode_video",
    ]
