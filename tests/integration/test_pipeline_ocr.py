"""The ocr operation end to end on generated pages: uploaded over HTTP, checked at
submit, run by an ocr pipeline actor on a real Ray cluster in its sandbox (no
network: the models load from the installed packages), outputs stored.

What each generated page shows (tests/generated/ocr_pages.py):

- a printed page, a page turned 90 degrees, a shaded noisy photo and an image-only PDF
  are read within 1 % CER (2 % for the photo); the turn is in the JSON;
- two columns under a title come out column by column;
- a born-digital PDF keeps its text layer (source ``text-layer``, no engine);
- lines upside down make the first engine's confidence low: the page escalates to
  ppocr-cls (which reads them right) and the JSON says so and why; each escalation
  costs the ocr profile's ``unit_costs.escalation`` on top of the estimate;
- the searchable PDF's invisible text, read back with PDFium, is the OCR text;
- the blocks are typed by the layout model, which runs in the sandbox from the wheel's
  file (what it makes of a title, paragraphs and a ruled table, and their text within
  1 % CER, is test_ocr_layout's, on the same page with the same chain in process).

At submit, before any job exists: an unknown language (422 invalid_params), a
10,000-page PDF (422 page_limit) and a 2.5-gigapixel PNG header (422 pixel_limit).

Credits of the escalating page's job (PostgreSQL; the same charge, release and 402 on
SQLite are test_ingest's, test_an_ocr_job_needs_its_escalations_reserved and
test_a_completion_charges_at_most_the_reservation; this adds the real engines'
escalations): the submit reserves the estimate plus the most the step may escalate
(an image is one page; the shipped chain of 3 engines escalates it twice at most), so
an account that holds only the estimate is refused (402, nothing created) rather than
charged past its balance; its own account holds exactly the worst case: it is charged
the estimate plus the escalations that happened, keeps the rest and holds nothing
afterwards.
"""

from __future__ import annotations

import io
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pytest
from sqlalchemy import select

from hypermedia import accounts
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import InvalidParams, PageLimit, PaymentRequired, PixelLimit
from hypermedia.ingest.client import HypermediaClient
from hypermedia.stack import Stack
from tests import error_inputs
from tests.factories import Person, make_user
from tests.generated import Generated, documents, ocr_pages
from tests.ocr_support import cer
from tests.ray_support import ray_stack

REPO = Path(__file__).resolve().parents[2]
STEM = "ocr-en-ppocr_ppocr-cls_tesseract-c97-d300"
PAGES = [
    "clean-page.png",
    "two-columns.png",
    "turned-page.png",
    "photo-page.jpg",
    "mixed-orientation.png",
    "scanned.pdf",
    "born-digital.pdf",
]
MAX_CER = {"photo-page.jpg": 0.02}
ESCALATING = "mixed-orientation.png"  # submitted by an account holding its worst case


@dataclass
class Credits:
    """The escalating page's job's money (millicredits) and accounts."""

    estimate: int
    worst: int
    engines: int
    funded: Person
    short: Person
    submitted: Any = None  # the funded account's submit
    held: accounts.Balance | None = None  # its balance once submitted
    after: accounts.Balance | None = None  # ... once the job completed
    refused: PaymentRequired | None = None  # the short account's submit
    short_after: accounts.Balance | None = None
    short_jobs: list[Any] | None = None


def _credits(stack: Stack, page: Path) -> Credits:
    profile = stack.catalog.get("ocr")
    estimate = profile.estimate_millicredits(page.stat().st_size)
    engines = len(profile.params["engines"])
    worst = estimate + _escalation_price() * (engines - 1)  # one page, every engine
    short = make_user(stack, credits=estimate / 1000)
    return Credits(estimate, worst, engines, make_user(stack, credits=worst / 1000), short)


def _escalation_price() -> int:
    profiles = tomllib.loads((REPO / "etc/profiles.toml").read_text())
    return round(float(profiles["profiles"]["ocr"]["unit_costs"]["escalation"]) * 1000)


def _balance(stack: Stack, person: Person) -> accounts.Balance:
    with transaction(stack.engine) as conn:
        return accounts.balance(conn, person.caller.user_id)


# 52 s on a quiet machine, 247 s beside a benchmark (load 10 on 2 cores).
@pytest.mark.timeout(900)
def test_ocr_through_the_worker(pg_engine, settings, tmp_path, generated: Generated):
    """Every page through the ocr actor, then every check below on what it stored."""
    with ray_stack(settings, pg_engine, tmp_path, {"ocr": 1}) as rs:
        person = make_user(rs.stack)
        credits = _credits(rs.stack, generated / f"ocr/{ESCALATING}")
        url = rs.settings.api_url
        assert url is not None
        with (
            HypermediaClient(url, person.api_key, timeout=60) as client,
            HypermediaClient(url, credits.funded.api_key, timeout=60) as funded,
        ):
            jobs = {}
            for name in PAGES:
                owner = funded if name == ESCALATING else client
                obj = owner.upload(generated / f"ocr/{name}")
                submitted = owner.process(obj.object_id, ["ocr"])
                jobs[name] = submitted.job_ids[0]
                if name == ESCALATING:
                    credits.submitted = submitted
                    credits.held = _balance(rs.stack, credits.funded)
            refusals = _refusals(client)
            _refuse_the_short_account(url, credits, generated, rs.stack)
            views = {
                name: (funded if name == ESCALATING else client).wait(job, timeout=600)
                for name, job in jobs.items()
            }
        credits.after = _balance(rs.stack, credits.funded)
        stored = {}
        for name, view in views.items():
            assert view.status == "completed", (name, view.error_code, view.error_message)
            bodies = {}
            for output in view.outputs:
                body = b"".join(rs.stack.storage.read(output.storage_key))
                assert len(body) == output.size_bytes > 0
                bodies[output.output_type.rsplit(".", 1)[1]] = (output, body)
            stored[name] = bodies
    check_outputs_and_their_types(stored)
    for name in PAGES:
        check_text_within_the_error_rate(stored, generated, name)
    check_two_columns_are_read_column_by_column(stored)
    check_the_turned_page_is_turned_upright(stored)
    check_a_born_digital_pdf_keeps_its_text_layer(stored)
    check_a_weak_first_reading_escalates(stored)
    check_escalations_are_charged_and_recorded(stored, views)
    check_the_escalating_job_is_charged_within_its_reservation(credits, views[ESCALATING])
    check_blocks_are_the_layout_regions(stored)
    for name in ("scanned.pdf", "clean-page.png", "two-columns.png"):
        check_the_searchable_pdf_carries_the_text(stored, name)
    check_refused_at_submit(refusals)


def _refusals(client: HypermediaClient) -> dict[str, Exception]:
    found: dict[str, Exception] = {}
    page = client.upload(ocr_pages_png(), filename="page.png")
    try:
        client.process(page.object_id, ["ocr"], params={"ocr": {"lang": "xx"}})
    except InvalidParams as exc:
        found["lang"] = exc
    many = documents.text_pdf([["p"]] * 10_000)
    big = client.upload(many, filename="many.pdf")
    try:
        client.process(big.object_id, ["ocr"])
    except PageLimit as exc:
        found["pages"] = exc
    bomb = client.upload(error_inputs.png_declaring(50_000, 50_000), filename="bomb.png")
    try:
        client.process(bomb.object_id, ["ocr"])
    except PixelLimit as exc:
        found["pixels"] = exc
    return found


def _refuse_the_short_account(
    url: str, credits: Credits, generated: Generated, stack: Stack
) -> None:
    with HypermediaClient(url, credits.short.api_key, timeout=60) as client:
        obj = client.upload(generated / f"ocr/{ESCALATING}")
        try:
            client.process(obj.object_id, ["ocr"])
        except PaymentRequired as exc:
            credits.refused = exc
    with transaction(stack.engine) as conn:
        mine = select(t.jobs.c.job_id).where(t.jobs.c.user_id == credits.short.caller.user_id)
        credits.short_jobs = list(conn.execute(mine).all())
    credits.short_after = _balance(stack, credits.short)


def ocr_pages_png() -> bytes:
    out = io.BytesIO()
    ocr_pages.clean_page(size=20, margin=20).save(out, format="PNG")
    return out.getvalue()


def _page_json(stored, name: str) -> Any:
    document = json.loads(stored[name]["json"][1])
    assert document["languages"] == ["en"]
    (page,) = document["pages"]
    return page


def check_outputs_and_their_types(stored):
    for name in PAGES:
        assert sorted(stored[name]) == ["json", "pdf", "txt"], name
        types = {ext: (o.output_type, o.content_type) for ext, (o, _) in stored[name].items()}
        assert types == {
            "txt": (f"{STEM}.txt", "text/plain; charset=utf-8"),
            "json": (f"{STEM}.json", "application/json"),
            "pdf": (f"{STEM}.pdf", "application/pdf"),
        }


def check_text_within_the_error_rate(stored, generated: Generated, name):
    text = stored[name]["txt"][1].decode("utf-8")
    truth = (generated / f"ocr/{name}").with_suffix(".txt").read_text()
    assert cer(text, truth).cer <= MAX_CER.get(name, 0.01), (name, text)


def check_two_columns_are_read_column_by_column(stored):
    text = stored["two-columns.png"]["txt"][1].decode("utf-8")
    assert text.index(ocr_pages.TITLE) < text.index(ocr_pages.LEFT_COLUMN[0])
    assert text.index(ocr_pages.LEFT_COLUMN[-1]) < text.index(ocr_pages.RIGHT_COLUMN[0])


def check_the_turned_page_is_turned_upright(stored):
    page = _page_json(stored, "turned-page.png")
    assert page["orientation"] in (90, 270) and page["source"] == "ocr"


def check_a_born_digital_pdf_keeps_its_text_layer(stored):
    page = _page_json(stored, "born-digital.pdf")
    assert (page["source"], page["engine"], page["attempts"]) == (
        "text-layer",
        "pdf-text-layer",
        [],
    )
    scanned = _page_json(stored, "scanned.pdf")
    assert scanned["source"] == "ocr" and scanned["engine"] == "ppocr"


def check_a_weak_first_reading_escalates(stored):
    page = _page_json(stored, "mixed-orientation.png")
    first, *later = page["attempts"]
    assert first["engine"] == "ppocr" and "confidence" in first["escalated_because"], page
    # ppocr-cls reads the weak lines upside down too: those are the right way.
    assert [a["engine"] for a in later] == ["ppocr-cls"] and page["engine"] == "ppocr-cls"
    assert page["confidence"] == max(a["confidence"] for a in page["attempts"])
    lines = [line for block in page["blocks"] for line in block["lines"]]
    assert {line["engine"] for line in lines} == {page["engine"]}
    assert {line["language"] for line in lines} == {"en"}
    clean = _page_json(stored, "clean-page.png")
    assert [a["engine"] for a in clean["attempts"]] == ["ppocr"], "a good page escalates not"


def check_escalations_are_charged_and_recorded(stored, views):
    """The ocr profile's unit_costs: each escalation costs its price on top of the
    estimate; the attempt records the step's pages, engine passes and escalations."""
    price = _escalation_price() / 1000
    page = _page_json(stored, "mixed-orientation.png")
    passes = len([a for a in page["attempts"] if "skipped" not in a])
    view = views["mixed-orientation.png"]
    (attempt,) = view.attempts
    assert passes >= 2 and attempt.units == {
        "page": 1,
        "ocr_page": 1,
        "engine_pass": passes,
        "escalation": passes - 1,
    }
    assert view.actual_credits == pytest.approx(view.estimated_credits + price * (passes - 1))
    clean = views["clean-page.png"]
    assert clean.attempts[0].units["escalation"] == 0
    assert clean.actual_credits == clean.estimated_credits
    born = views["born-digital.pdf"]
    assert born.attempts[0].units == {
        "page": 1,
        "ocr_page": 0,
        "engine_pass": 0,
        "escalation": 0,
    }


def check_the_escalating_job_is_charged_within_its_reservation(credits: Credits, view):
    estimate, worst = credits.estimate / 1000, credits.worst / 1000
    refused = credits.refused
    assert refused is not None, "an account holding only the estimate was not refused"
    assert refused.details["required_credits"] == worst
    assert refused.details["available_credits"] == estimate
    assert f"this needs {worst:g} reserved" in refused.message
    assert credits.short_jobs == []
    assert credits.short_after == accounts.Balance(credits.estimate, 0)
    (job,) = credits.submitted.jobs
    assert (job.estimated_credits, job.reserved_credits) == (estimate, worst)
    assert credits.submitted.reserved_credits == worst
    assert credits.held == accounts.Balance(credits.worst, credits.worst)
    (attempt,) = view.attempts
    escalations = attempt.units["escalation"]
    assert 1 <= escalations <= credits.engines - 1, attempt.units
    actual = credits.estimate + _escalation_price() * escalations
    assert view.actual_credits is not None and round(view.actual_credits * 1000) == actual
    assert view.reserved_credits == worst
    # Charged what happened; the rest of the reservation is back; nothing held.
    assert credits.after == accounts.Balance(credits.worst - actual, 0)
    assert credits.after.balance_millicredits >= 0


def check_blocks_are_the_layout_regions(stored):
    page = _page_json(stored, "clean-page.png")
    assert page["layout"]["model"] == "pp_layout_cdla" and page["layout"]["regions"] >= 1
    assert page["blocks"][0]["type"] == "text", page["blocks"]


def check_the_searchable_pdf_carries_the_text(stored, name):
    document = pdfium.PdfDocument(io.BytesIO(stored[name]["pdf"][1]))
    assert len(document) == 1
    layer = document[0].get_textpage().get_text_range()
    text = stored[name]["txt"][1].decode("utf-8")
    assert cer(layer, text).cer <= 0.01, (layer, text)
    page = _page_json(stored, name)
    width, height = document[0].get_size()
    # The page is the image at its resolution; a PNG without one is taken as 300 dpi.
    assert width == pytest.approx(page["width"] * 72 / page["dpi"], rel=0.01)
    assert height == pytest.approx(page["height"] * 72 / page["dpi"], rel=0.01)
    assert page["dpi"] == 300


def check_refused_at_submit(refusals):
    assert "unknown language 'xx'" in refusals["lang"].message
    assert set(refusals) == {"lang", "pages", "pixels"}, refusals
