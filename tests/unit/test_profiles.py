"""Processing profiles: the shipped file, credit arithmetic, and errors naming the key.

The credit estimate is the one submits reserve: the profile's row
(:class:`~hypermedia.jobs.catalog.ProfileRecord`), built from a configured profile as
:func:`~hypermedia.jobs.catalog.sync_profiles` writes it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hypermedia.config import DEFAULT_QUEUES, REPO_ETC
from hypermedia.errors import ConfigError, InvalidParams, PageLimit
from hypermedia.jobs.catalog import ProfileRecord, record_values
from hypermedia.profiles import BYTES_PER_MB, MILLI, Profile, load_profiles, parse_profiles
from hypermedia.sandbox.inspect import Inspection
from pipelines import registry

MB = 1024 * 1024
SHIPPED = REPO_ETC / "profiles.toml"

VALID: dict[str, Any] = {
    "queue": "images",
    "version": 1,
    "base_cost": 0.1,
    "cost_per_mb": 0.02,
    "timeout_seconds": 30,
    "memory_limit_mb": 1024,
    "max_input_bytes": 100 * MB,
    "max_attempts": 3,
    "default_priority": 2,
}


def profile(**changes: Any) -> Profile:
    return Profile(operation="thumbnail", **{**VALID, **changes})


def as_record(configured: Profile, profile_id: int = 1) -> ProfileRecord:
    """The profile's row, with the values ``sync_profiles`` writes."""
    return ProfileRecord(
        profile_id=profile_id,
        operation=configured.operation,
        version=configured.version,
        **record_values(configured),
    )


def record(**changes: Any) -> ProfileRecord:
    return as_record(profile(**changes))


def document(operation: str = "thumbnail", /, **changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(VALID)
    body.update(changes)
    return {"profiles": {operation: body}}


# -- the shipped file -----------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped() -> dict[str, Profile]:
    return load_profiles(SHIPPED, DEFAULT_QUEUES)


def test_the_shipped_profiles_load(shipped):
    assert sorted(shipped) == sorted(
        [
            "thumbnail",
            "resize",
            "compress",
            "convert",
            "pdf_preview",
            "docx_to_pdf",
            "extract_text",
            "ocr",
            "transcode_video",
            "transcode_audio",
            "regenerate",
        ]
    )
    for operation, item in shipped.items():
        assert item.operation == operation


def test_every_default_queue_has_a_profile(shipped):
    assert {p.queue for p in shipped.values()} == set(DEFAULT_QUEUES)


@pytest.mark.parametrize(
    ("operation", "queue"),
    [
        ("thumbnail", "images"),
        ("resize", "images"),
        ("compress", "images"),
        ("convert", "images"),
        ("pdf_preview", "documents"),
        ("docx_to_pdf", "documents"),
        ("extract_text", "documents"),
        ("ocr", "ocr"),
        ("transcode_video", "media"),
        ("transcode_audio", "media"),
        ("regenerate", "bulk"),
    ],
)
def test_shipped_queue_of_each_operation(shipped, operation, queue):
    assert shipped[operation].queue == queue


def test_bulk_work_runs_at_low_priority(shipped):
    # DESIGN: bulk regeneration and backfill run at priority 7-10.
    for item in shipped.values():
        if item.queue == "bulk":
            assert 7 <= item.default_priority <= 10


def test_shipped_params(shipped):
    assert shipped["thumbnail"].params == {
        "width": 320,
        "height": 320,
        "format": "webp",
        "quality": 80,
    }
    assert shipped["ocr"].params["lang"] == "en"
    assert shipped["ocr"].params["engines"] == ["ppocr", "ppocr-cls", "tesseract"]
    assert shipped["docx_to_pdf"].params == {}


def test_shipped_costs_are_whole_millicredits(shipped):
    for item in shipped.values():
        assert item.base_cost_millicredits == pytest.approx(item.base_cost * MILLI, abs=1e-9)
        assert item.cost_per_mb_millicredits == pytest.approx(item.cost_per_mb * MILLI, abs=1e-9)


# -- estimate arithmetic --------------------------------------------------------------

ESTIMATES = [
    # (base_cost, cost_per_mb, size_bytes, expected millicredits)
    (0.1, 0.02, 0, 100),
    (0.1, 0.02, 1, 101),  # any input rounds the variable part up to a millicredit
    (0.1, 0.02, MB // 2, 110),
    (0.1, 0.02, MB // 2 + 1, 111),
    (0.1, 0.02, MB, 120),
    (0.1, 0.02, MB + 1, 121),
    (0.1, 0.02, 3 * MB // 2, 130),
    (0.1, 0.02, 100 * MB, 2100),
    (0.1, 0.03, MB, 130),
    (0.2, 0.05, 10 * MB, 700),
    (0.5, 0.1, 7 * MB, 1200),
    (1.0, 0.2, MB, 1200),
    (1.0, 0.2, 5 * MB + 5, 2001),
    (2.0, 0.05, 10 * 1024 * MB, 514_000),  # 10 GB video
    (2.0, 0.05, 10 * 1024 * MB - 1, 514_000),
    (0.5, 0.02, 2 * 1024 * MB, 41_460),  # 2 GB audio
    (0.05, 0.01, 0, 50),
    (0.05, 0.01, 1, 51),
    (0.0, 0.0, 10 * MB, 0),
    (0.0, 0.001, 1, 1),
    (0.0, 0.001, MB, 1),
    (0.0, 0.001, MB + 1, 2),
    (1.234, 0.0, 123 * MB, 1234),
    (0.1, 0.3, 1, 101),  # 0.1 + 0.2 style float noise must not leak in
    (0.3, 0.1, 3 * MB, 600),
    (100.0, 1.0, 1_000 * MB, 1_100_000),
]


@pytest.mark.parametrize(("base", "per_mb", "size", "expected"), ESTIMATES)
def test_estimate(base, per_mb, size, expected):
    estimate = record(base_cost=base, cost_per_mb=per_mb).estimate_millicredits(size)
    assert type(estimate) is int
    assert estimate == expected


@pytest.mark.parametrize("size", [0, 1, 2, 999, MB - 1, MB, MB + 1, 17 * MB + 3, 10**12])
def test_estimate_is_the_exact_ceiling(size):
    item = record(base_cost=0.1, cost_per_mb=0.02)
    exact_numerator = 20 * size  # millicredits x bytes
    ceiling = exact_numerator // BYTES_PER_MB + (exact_numerator % BYTES_PER_MB > 0)
    assert item.estimate_millicredits(size) == 100 + ceiling


def test_estimate_grows_with_size():
    item = record(base_cost=0.1, cost_per_mb=0.02)
    sizes = [0, 1, 10, MB // 3, MB, 2 * MB, 50 * MB, 100 * MB]
    estimates = [item.estimate_millicredits(s) for s in sizes]
    assert estimates == sorted(estimates)


def test_huge_inputs_stay_exact_integers():
    item = record(base_cost=0.1, cost_per_mb=0.02)
    size = 10**18 + 1
    assert item.estimate_millicredits(size) == 100 + -(-20 * size // MB)


@pytest.mark.parametrize(
    ("base", "millicredits"),
    [(0.1, 100), (0.0, 0), (0.001, 1), (1.0, 1000), (2.5, 2500), (0.0004, 0), (0.0006, 1)],
)
def test_costs_in_millicredits(base, millicredits):
    assert profile(base_cost=base).base_cost_millicredits == millicredits
    assert profile(cost_per_mb=base).cost_per_mb_millicredits == millicredits


def test_shipped_thumbnail_estimate(shipped):
    assert as_record(shipped["thumbnail"]).estimate_millicredits(5 * MB) == 100 + 5 * 20
    assert as_record(shipped["ocr"]).estimate_millicredits(2 * MB) == 1000 + 2 * 200


@pytest.mark.parametrize(
    ("costs", "units", "expected"),
    [
        ({"escalation": 0.25}, None, 1400),  # the step reported nothing: the estimate
        ({"escalation": 0.25}, {}, 1400),
        ({"escalation": 0.25}, {"escalation": 0}, 1400),
        ({"escalation": 0.25}, {"escalation": 1}, 1650),
        ({"escalation": 0.25}, {"escalation": 7, "page": 9}, 3150),  # page: no price
        ({}, {"escalation": 7}, 1400),  # no price: nothing more
        ({"escalation": 0.0004, "page": 0.1}, {"escalation": 5, "page": 3}, 1700),
        ({"escalation": 0.0006}, {"escalation": 10**6}, 1400 + 10**6),
    ],
)
def test_charge_is_the_estimate_plus_priced_units(costs, units, expected):
    item = as_record(profile(unit_costs=costs))
    assert item.charge_millicredits(1400, units) == expected


def test_shipped_ocr_charges_each_escalation(shipped):
    ocr = as_record(shipped["ocr"])
    assert ocr.unit_costs_millicredits == {"escalation": 250}
    assert ocr.charge_millicredits(1000, {"page": 2, "engine_pass": 5, "escalation": 3}) == 1750


def _ocr_params(shipped, **changes: Any) -> dict[str, Any]:
    return {**shipped["ocr"].params, **changes}


IMAGE = Inspection("image", "image/png", {"width": 800, "height": 600})


@pytest.mark.parametrize(
    ("inspection", "changes", "pages", "engines"),
    [
        (IMAGE, {}, 1, 3),  # an image is one page; the shipped chain has 3 engines
        (Inspection("image", "image/tiff", {"pages": 3}), {}, 3, 3),  # each TIFF page read
        (Inspection("image", "image/tiff", {"pages": 600}), {}, 500, 3),  # refused past 500
        (Inspection("image", "image/gif", {"pages": 3}), {}, 1, 3),  # a GIF: its first frame
        (Inspection("pdf", "application/pdf", {"pages": 3}), {}, 3, 3),
        (Inspection("pdf", "application/pdf", {"pages": 3}), {"engines": ["ppocr"]}, 3, 1),
        (Inspection("pdf", "application/pdf", {"pages": 3}), {"max_pages": 2}, 2, 3),
        (Inspection("pdf", "application/pdf", {}), {}, 500, 3),  # count unknown: max_pages
        (Inspection("pdf", "application/pdf", {}), {"max_pages": 7}, 7, 3),
        (None, {"engines": ["ppocr", "tesseract"]}, 500, 2),  # never inspected: max_pages
    ],
)
def test_ocr_bounds_its_units_by_pages_and_engines(shipped, inspection, changes, pages, engines):
    bound = registry.max_units("ocr", _ocr_params(shipped, **changes), inspection)
    assert bound == {
        "page": pages,
        "ocr_page": pages,
        "engine_pass": pages * engines,
        "escalation": pages * (engines - 1),
    }


def test_shipped_ocr_reserves_its_escalations_at_most(shipped):
    """Estimate plus 0.25 per escalation the input may have: 1 page x 2 for an image, 3 x
    2 for a 3-page PDF, none with one engine; thumbnail prices no unit."""
    ocr = as_record(shipped["ocr"])
    pdf = Inspection("pdf", "application/pdf", {"pages": 3})
    assert ocr.reserve_millicredits(1200, _ocr_params(shipped), IMAGE) == 1700
    assert ocr.reserve_millicredits(1200, _ocr_params(shipped), pdf) == 2700
    assert ocr.reserve_millicredits(1200, _ocr_params(shipped, engines=["ppocr"]), pdf) == 1200
    thumbnail = as_record(shipped["thumbnail"])
    assert thumbnail.reserve_millicredits(300, shipped["thumbnail"].params, IMAGE) == 300
    with pytest.raises(InvalidParams, match="engines"):
        ocr.reserve_millicredits(1200, _ocr_params(shipped, engines=["nope"]), pdf)


def test_a_priced_unit_its_step_does_not_bound_is_refused():
    """A price on a unit the step declares no bound for would let a charge pass the
    reservation: refused at load, naming the key. Units priced 0 and operations no step
    implements (nothing reports their units) are let through."""
    with pytest.raises(ConfigError) as info:
        parse_profiles(document(unit_costs={"frames": 0.5}), DEFAULT_QUEUES, "p.toml")
    assert info.value.key == "p.toml: profiles.thumbnail.unit_costs.frames"
    assert "declares no bound for 'frames'" in info.value.message
    assert "below zero" in info.value.message
    ocr = document("ocr", queue="ocr", unit_costs={"escalation": 0.25, "minutes": 1.0})
    with pytest.raises(ConfigError) as info:
        parse_profiles(ocr, DEFAULT_QUEUES, "p.toml")
    assert info.value.key == "p.toml: profiles.ocr.unit_costs.minutes"
    assert "it bounds engine_pass, escalation, ocr_page, page" in info.value.message
    free = document(unit_costs={"frames": 0.0})
    assert parse_profiles(free, DEFAULT_QUEUES, "p.toml")["thumbnail"].unit_costs == {"frames": 0.0}
    nothing = document("not_a_step", unit_costs={"frames": 0.5})
    assert parse_profiles(nothing, DEFAULT_QUEUES, "p.toml")["not_a_step"].unit_costs


# -- a job's time from its pages ------------------------------------------------------


def _ocr(**changes: Any) -> ProfileRecord:
    body = {**VALID, "queue": "ocr", "timeout_seconds": 300, **changes}
    return as_record(Profile(operation="ocr", **body))


def _pdf(pages: int | None) -> Inspection:
    return Inspection("pdf", "application/pdf", {} if pages is None else {"pages": pages})


@pytest.mark.parametrize(
    ("inspection", "params", "expected"),
    [
        (IMAGE, {}, 300 + 12),  # one page
        (_pdf(40), {}, 300 + 12 * 40),
        (_pdf(500), {}, 300 + 12 * 500),
        (_pdf(None), {}, 300 + 12 * 500),  # count unknown: max_pages, the most it reads
        (None, {}, 300 + 12 * 500),  # never inspected: the same
        (_pdf(40), {"max_pages": 30}, 300 + 12 * 30),  # the step reads no more than 30
        (Inspection("image", "image/tiff", {"pages": 7}), {}, 300 + 12 * 7),
    ],
)
def test_a_jobs_time_grows_with_its_pages(shipped, inspection, params, expected):
    """The shipped ocr profile: 300 s, and 12 s more for each page the step may read."""
    ocr = as_record(shipped["ocr"])
    assert ocr.job_timeout_seconds(_ocr_params(shipped, **params), inspection) == expected


def test_a_jobs_time_is_its_profiles_without_time_a_page(shipped):
    thumbnail = as_record(shipped["thumbnail"])
    assert thumbnail.job_timeout_seconds(shipped["thumbnail"].params, IMAGE) == 30
    ocr = _ocr()
    assert ocr.job_timeout_seconds({"max_pages": 500}, _pdf(400)) == 300


def test_pages_past_the_time_cap_are_page_limit_naming_the_most_allowed():
    """300 + 12.5 a page within 1,000 s: 56 pages (1,000 s); the 57th is refused."""
    ocr = _ocr(timeout_seconds_per_page=12.5, max_timeout_seconds=1000)
    params = {"max_pages": 500}
    assert ocr.job_timeout_seconds(params, _pdf(56)) == 1000
    assert ocr.job_timeout_seconds(params, _pdf(3)) == 338  # 337.5, rounded up
    with pytest.raises(PageLimit) as info:
        ocr.job_timeout_seconds(params, _pdf(57))
    assert info.value.code == "page_limit"
    assert info.value.details["limit"] == 56 and info.value.details["pages"] == 57
    assert "at most 56 pages" in info.value.message and "1,000 s" in info.value.message
    with pytest.raises(PageLimit):  # count unknown: the step may read max_pages
        ocr.job_timeout_seconds(params, _pdf(None))
    with pytest.raises(InvalidParams, match="engines"):
        ocr.job_timeout_seconds({"engines": ["nope"]}, _pdf(3))


@pytest.mark.parametrize(
    ("operation", "changes", "key", "problem"),
    [
        ("ocr", {"timeout_seconds_per_page": 12}, "max_timeout_seconds", "expected beside"),
        ("ocr", {"max_timeout_seconds": 7200}, "timeout_seconds_per_page", "expected beside"),
        (
            "ocr",
            {"timeout_seconds_per_page": 12, "max_timeout_seconds": 311},
            "max_timeout_seconds",
            "leaves no time for a page",
        ),
        (
            "ocr",
            {"timeout_seconds_per_page": 0, "max_timeout_seconds": 7200},
            "timeout_seconds_per_page",
            "greater than 0",
        ),
        (
            "thumbnail",  # its step reports no pages
            {"timeout_seconds_per_page": 1, "max_timeout_seconds": 600},
            "timeout_seconds_per_page",
            "declares no bound for the pages it reads",
        ),
    ],
)
def test_bad_time_a_page_names_the_key(operation, changes, key, problem):
    body = document(operation, queue="ocr", timeout_seconds=300, **changes)
    with pytest.raises(ConfigError) as info:
        parse_profiles(body, DEFAULT_QUEUES, "p.toml")
    assert info.value.key == f"p.toml: profiles.{operation}.{key}"
    assert problem in info.value.message


# -- bad profiles ---------------------------------------------------------------------

BAD_FIELDS = [
    # (field, value, fragment of the problem)
    ("version", 0, "greater than or equal to 1"),
    ("version", "one", "valid integer"),
    ("base_cost", -0.1, "greater than or equal to 0"),
    ("base_cost", "cheap", "valid number"),
    ("cost_per_mb", -1, "greater than or equal to 0"),
    ("timeout_seconds", 0, "greater than or equal to 1"),
    ("timeout_seconds", 24 * 3600 + 1, "less than or equal to 86400"),
    ("memory_limit_mb", 15, "greater than or equal to 16"),
    ("max_input_bytes", 0, "greater than or equal to 1"),
    ("max_attempts", 0, "greater than or equal to 1"),
    ("max_attempts", 101, "less than or equal to 100"),
    ("default_priority", 0, "greater than or equal to 1"),
    ("default_priority", 11, "less than or equal to 10"),
    ("params", "width=3", "valid dictionary"),
    ("queue", 3, "valid string"),
    ("unit_costs", {"escalation": -1.0}, "must be 0 or more"),
    ("unit_costs", {"Escalation!": 1.0}, "is not a unit name"),
    # The file's own types: TOML has numbers and booleans, and a string or a boolean
    # where a number goes is a mistake, not a number (both were taken as one).
    ("timeout_seconds", "30", "valid integer"),
    ("default_priority", True, "valid integer"),
    ("max_input_bytes", 1e8, "valid integer"),
    # Finite and within what the record and setrlimit hold: inf and 1e300 stopped
    # `db upgrade` with "internal: OverflowError"; a memory limit of 1e14 MB was synced
    # and failed every job (pipeline_crashed: OverflowError).
    ("base_cost", float("inf"), "finite number"),
    ("base_cost", 1e300, "less than"),
    ("cost_per_mb", float("nan"), "finite number"),
    ("memory_limit_mb", 10**14, "less than or equal to 1048576"),
    ("max_output_bytes", 2**63, "less than or equal to"),
    ("max_input_bytes", 2**63, "less than or equal to"),
]


@pytest.mark.parametrize(("field", "value", "problem"), BAD_FIELDS)
def test_bad_value_names_the_profile_key(field, value, problem):
    with pytest.raises(ConfigError) as info:
        parse_profiles(document(**{field: value}), DEFAULT_QUEUES, "p.toml")
    assert info.value.key == f"p.toml: profiles.thumbnail.{field}"
    assert problem in info.value.message
    assert info.value.code == "config_invalid"


@pytest.mark.parametrize(
    ("limits", "key", "problem"),
    [
        ({"jpeg_shrink_on_load": "yes"}, "jpeg_shrink_on_load", "valid boolean"),
        ({"max_pages": "10"}, "max_pages", "valid integer"),
        ({"max_duration_seconds": float("inf")}, "max_duration_seconds", "finite number"),
        ({"max_zip_ratio": float("nan")}, "max_zip_ratio", "finite number"),
    ],
)
def test_bad_limit_names_the_limit_key(limits, key, problem):
    with pytest.raises(ConfigError) as info:
        parse_profiles(document(limits=limits), DEFAULT_QUEUES, "p.toml")
    assert info.value.key == f"p.toml: profiles.thumbnail.limits.{key}"
    assert problem in info.value.message


@pytest.mark.parametrize("field", sorted(VALID))
def test_missing_field_names_the_profile_key(field):
    data = document()
    del data["profiles"]["thumbnail"][field]
    with pytest.raises(ConfigError) as info:
        parse_profiles(data, DEFAULT_QUEUES, "p.toml")
    assert info.value.key == f"p.toml: profiles.thumbnail.{field}"
    assert "required" in info.value.message.lower()


@pytest.mark.parametrize("extra", ["cost", "priority", "timeout", "queue_name"])
def test_unknown_profile_keys_are_refused(extra):
    with pytest.raises(ConfigError) as info:
        parse_profiles(document(**{extra: 1}), DEFAULT_QUEUES, "p.toml")
    assert info.value.key == f"p.toml: profiles.thumbnail.{extra}"
    assert "unknown key" in info.value.message


def _misspelt(body: dict[str, Any], key: str, typo: str) -> None:
    body[typo] = body.pop(key, 1)


@pytest.mark.parametrize(
    ("key", "typo", "also_missing"),
    [
        # A required key misspelt: it was refused as "default_priority: Field required",
        # a key the operator believes they wrote.
        ("default_priority", "default_prority", None),
        ("max_attempts", "max_attempt", None),
        ("max_processes", "max_processess", None),  # not required
        # Another error beside it does not hide the typo.
        ("default_priority", "default_prority", "version"),
        ("max_processes", "max_proceses", "timeout_seconds"),
    ],
)
def test_a_misspelt_key_is_named_as_written_with_the_known_one(key, typo, also_missing):
    data = document()
    body = data["profiles"]["thumbnail"]
    _misspelt(body, key, typo)
    if also_missing:
        del body[also_missing]
    with pytest.raises(ConfigError) as info:
        parse_profiles(data, DEFAULT_QUEUES, "etc/profiles.toml")
    assert info.value.key == f"etc/profiles.toml: profiles.thumbnail.{typo}"
    assert str(info.value) == (
        f"etc/profiles.toml: profiles.thumbnail.{typo}: unknown key (did you mean {key}?)"
    )


def test_a_misspelt_limit_or_top_level_key_is_named_with_the_known_one():
    with pytest.raises(ConfigError) as info:
        parse_profiles(document(limits={"max_pixel": 10}), DEFAULT_QUEUES, "p.toml")
    assert str(info.value) == (
        "p.toml: profiles.thumbnail.limits.max_pixel: unknown key (did you mean max_pixels?)"
    )
    data = {"profile": document()["profiles"], **document()}
    with pytest.raises(ConfigError) as info:
        parse_profiles(data, DEFAULT_QUEUES, "p.toml")
    assert str(info.value) == "p.toml: profile: unknown top-level key (did you mean profiles?)"


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        # A typo: every submit of the operation was refused (422 invalid_params) instead.
        ({"widht": 320, "height": 320, "format": "webp"}, "unknown parameter(s) widht"),
        ({"width": 320, "height": 320, "format": "webp", "quality": 500}, "quality"),
        ({"width": "320", "height": 320, "format": "webp"}, "width"),
    ],
)
def test_profile_params_every_submit_would_be_refused_for_are_refused(params, problem):
    with pytest.raises(ConfigError) as info:
        parse_profiles(document(params=params), DEFAULT_QUEUES, "p.toml")
    assert info.value.key == "p.toml: profiles.thumbnail.params"
    assert problem in info.value.message


def test_profile_params_may_leave_what_the_operation_needs_to_the_requests():
    # thumbnail needs width, height and format: a request may set what the profile does
    # not (each submit's check refuses a request that sets none).
    loaded = parse_profiles(document(params={"width": 320}), DEFAULT_QUEUES, "p.toml")
    assert loaded["thumbnail"].params == {"width": 320}
    assert parse_profiles(document(params={}), DEFAULT_QUEUES, "p.toml")["thumbnail"].params == {}


@pytest.mark.parametrize("queue", ["video", "Images", "", "image"])
def test_unknown_queue_is_refused(queue):
    with pytest.raises(ConfigError) as info:
        parse_profiles(document(queue=queue), DEFAULT_QUEUES, "p.toml")
    assert info.value.key == "p.toml: profiles.thumbnail.queue"
    assert f"unknown queue {queue!r}" in info.value.message
    assert "images" in info.value.message


def test_queue_must_be_one_of_the_configured_queues():
    data = document(queue="thumbs")
    assert parse_profiles(data, ["thumbs"], "p.toml")["thumbnail"].queue == "thumbs"
    with pytest.raises(ConfigError, match="unknown queue"):
        parse_profiles(document(queue="images"), ["thumbs"], "p.toml")


@pytest.mark.parametrize("operation", ["Thumbnail", "1thumb", "thumb-nail", "a" * 65, ""])
def test_bad_operation_names(operation):
    with pytest.raises(ConfigError) as info:
        parse_profiles(document(operation), DEFAULT_QUEUES, "p.toml")
    assert info.value.key == f"p.toml: profiles.{operation}.operation"


@pytest.mark.parametrize(
    ("data", "key", "problem"),
    [
        ({}, "p.toml: profiles", "at least one"),
        ({"profiles": {}}, "p.toml: profiles", "at least one"),
        ({"profiles": "thumbnail"}, "p.toml: profiles", "at least one"),
        ({"profiles": {"thumbnail": 3}}, "p.toml: profiles.thumbnail", "expected a table"),
        ({**document(), "queues": {}}, "p.toml: queues", "unknown top-level key"),
    ],
)
def test_bad_document_shape(data, key, problem):
    with pytest.raises(ConfigError) as info:
        parse_profiles(data, DEFAULT_QUEUES, "p.toml")
    assert info.value.key == key
    assert problem in info.value.message


def test_profiles_are_frozen():
    item = profile()
    with pytest.raises(Exception, match="frozen"):
        item.version = 2  # type: ignore[misc]


def test_load_profiles_missing_file(tmp_path):
    missing = tmp_path / "profiles.toml"
    with pytest.raises(ConfigError) as info:
        load_profiles(missing, DEFAULT_QUEUES)
    assert info.value.key == "profiles_path (HYPERMEDIA_PROFILES_PATH)"
    assert str(missing) in info.value.message


def test_load_profiles_bad_toml(tmp_path):
    path = tmp_path / "profiles.toml"
    path.write_text("[profiles.thumbnail\nqueue = 'images'\n")
    with pytest.raises(ConfigError) as info:
        load_profiles(path, DEFAULT_QUEUES)
    assert info.value.key == str(path)
    assert "not valid TOML" in info.value.message


def test_load_profiles_names_the_file_in_errors(tmp_path):
    path = tmp_path / "profiles.toml"
    path.write_text(
        "[profiles.thumbnail]\nqueue = 'video'\n"
        + "".join(f"{k} = {v!r}\n" for k, v in VALID.items() if k != "queue")
    )
    with pytest.raises(ConfigError) as info:
        load_profiles(path, DEFAULT_QUEUES)
    assert info.value.key == f"{path}: profiles.thumbnail.queue"
