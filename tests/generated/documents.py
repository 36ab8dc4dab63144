"""Documents: flat ODF sources written here, converted by LibreOffice headless into every
office format the steps take; PDFs from LibreOffice (born-digital text) and from code.

The texts the tests look for are the constants below. LibreOffice stamps the time of
conversion into its packages, so DOCX, ODT, XLSX ... differ from run to run in those
dates; everything drawn by code here is the same bytes every time.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from xml.sax.saxutils import escape

from pipelines.office_libreoffice import write_build_id
from tests import error_inputs
from tests.generated.entries import Entry
from tests.generated.images import picture

TITLE = "Generated Report"
HEADING = "Main Heading"
BODY = "The quick brown fox jumps over the lazy dog."
LIST_INTRO = "Here is a numbered list"
HEADER = "This is the header text."
FOOTER = "This is the footer text."
FOOTNOTE = "This is a footnote."
TEXT_BOX = "Here is a text box"
UMLAUTS = "Grüße aus Köln, café"
PAGES = 12
PAGE_WORDS = "Page {n} of the generated document"
ARABIC = "اللغة العربية"
SHEETS = ("Income", "Expenses", "Notes")
SHEET_TITLE = "Numbers and their squares"
SLIDE_TITLES = ("Title of the first slide", "Second slide")
SLIDE_BODY = "Bullet point on the second slide"
LINKED_TEXT = "An image linked by absolute path outside the document folder"
HELLO = "Hello World"

_OFFICE = 'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0"'
_NAMESPACES = " ".join(
    [
        _OFFICE,
        'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0"',
        'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"',
        'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0"',
        'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0"',
        'xmlns:fo="urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0"',
        'xmlns:svg="urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0"',
        'xmlns:xlink="http://www.w3.org/1999/xlink"',
        'xmlns:presentation="urn:oasis:names:tc:opendocument:xmlns:presentation:1.0"',
        'xmlns:office_meta="urn:oasis:names:tc:opendocument:xmlns:meta:1.0"',
    ]
)
# A4 in every text document: 595.3 x 841.9 points.
_PAGE_LAYOUT = (
    '<style:page-layout style:name="A4"><style:page-layout-properties fo:page-width="21cm"'
    ' fo:page-height="29.7cm" fo:margin="2cm"/></style:page-layout>'
)


def _flat(mimetype: str, styles: str, master: str, body: str, font: str = "") -> str:
    faces = (
        f'<office:font-face-decls><style:font-face style:name="{font}"'
        f' svg:font-family="&apos;{font}&apos;"/></office:font-face-decls>'
        if font
        else ""
    )
    default = (
        f'<style:default-style style:family="paragraph"><style:text-properties'
        f' style:font-name="{font}" style:font-name-complex="{font}"/></style:default-style>'
        if font
        else ""
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<office:document {_NAMESPACES} office:version="1.3" office:mimetype="{mimetype}">'
        f"{faces}<office:styles>{default}{styles}</office:styles>"
        f"<office:automatic-styles>{_PAGE_LAYOUT}</office:automatic-styles>"
        f"<office:master-styles>{master}</office:master-styles>"
        f"<office:body>{body}</office:body></office:document>"
    )


def _text_document(paragraphs: str, *, header: str = "", footer: str = "", font: str = "") -> str:
    styles = (
        '<style:style style:name="Break" style:family="paragraph">'
        '<style:paragraph-properties fo:break-before="page"/></style:style>'
    )
    parts = ""
    if header:
        parts += f"<style:header><text:p>{escape(header)}</text:p></style:header>"
    if footer:
        parts += f"<style:footer><text:p>{escape(footer)}</text:p></style:footer>"
    master = f'<style:master-page style:name="Standard" style:page-layout-name="A4">{parts}'
    master += "</style:master-page>"
    body = f"<office:text>{paragraphs}</office:text>"
    return _flat("application/vnd.oasis.opendocument.text", styles, master, body, font)


def report_fodt() -> str:
    """Heading, body, a numbered list, a footnote, a text box, a header and a footer."""
    items = "".join(
        f"<text:list-item><text:p>Item {n}</text:p></text:list-item>" for n in (1, 2, 3)
    )
    box = (
        '<draw:frame text:anchor-type="paragraph" svg:width="6cm" svg:height="2cm"'
        ' svg:x="1cm" svg:y="0cm" draw:z-index="0">'
        f"<draw:text-box><text:p>{TEXT_BOX}</text:p></draw:text-box></draw:frame>"
    )
    footnote = (
        '<text:note text:id="n1" text:note-class="footnote"><text:note-citation>1'
        f"</text:note-citation><text:note-body><text:p>{FOOTNOTE}</text:p></text:note-body>"
        "</text:note>"
    )
    paragraphs = (
        f'<text:h text:outline-level="1">{TITLE}</text:h>'
        f'<text:h text:outline-level="2">{HEADING}</text:h>'
        f"<text:p>{BODY}{footnote}</text:p>"
        f"<text:p>{LIST_INTRO}:</text:p><text:list>{items}</text:list>"
        f"<text:p>{box}{escape(UMLAUTS)}</text:p>"
    )
    return _text_document(paragraphs, header=HEADER, footer=FOOTER)


def pages_fodt(pages: int) -> str:
    """``pages`` A4 pages, each one paragraph: ``Page n of the generated document``."""
    breaks = ["", *[' text:style-name="Break"'] * (pages - 1)]
    paragraphs = "".join(
        f"<text:p{style}>{PAGE_WORDS.format(n=n)}</text:p>" for n, style in enumerate(breaks, 1)
    )
    return _text_document(paragraphs)


def arabic_fodt() -> str:
    return _text_document(f"<text:p>{ARABIC}</text:p>", font="DejaVu Sans")


def linked_fodt(target: str) -> str:
    """A text document showing an image by link (``target``, a URL), not embedded."""
    frame = (
        '<draw:frame text:anchor-type="paragraph" svg:width="4cm" svg:height="3cm">'
        f'<draw:image xlink:href="{escape(target)}" xlink:type="simple" xlink:show="embed"'
        ' xlink:actuate="onLoad"/></draw:frame>'
    )
    return _text_document(f"<text:p>{LINKED_TEXT}</text:p><text:p>{frame}</text:p>")


def _cell(value: str | int) -> str:
    if isinstance(value, int):
        return (
            f'<table:table-cell office:value-type="float" office:value="{value}">'
            f"<text:p>{value}</text:p></table:table-cell>"
        )
    return (
        f'<table:table-cell office:value-type="string"><text:p>{escape(value)}</text:p>'
        "</table:table-cell>"
    )


def _square(n: int) -> list[str | int]:
    return [n, n * n]


def spreadsheet_fods() -> str:
    """Three sheets: a title and ten numbers with their squares; costs; a note."""
    rows: dict[str, list[list[str | int]]] = {
        SHEETS[0]: [[SHEET_TITLE], ["Number", "Square"], *[_square(n) for n in range(1, 11)]],
        SHEETS[1]: [["Item", "Cost"], ["Rent", 1200], ["Power", 80]],
        SHEETS[2]: [[UMLAUTS]],
    }
    tables = "".join(
        f'<table:table table:name="{name}">'
        + "".join(
            "<table:table-row>" + "".join(_cell(value) for value in row) + "</table:table-row>"
            for row in sheet
        )
        + "</table:table>"
        for name, sheet in rows.items()
    )
    body = f"<office:spreadsheet>{tables}</office:spreadsheet>"
    return _flat("application/vnd.oasis.opendocument.spreadsheet", "", "", body)


def presentation_fodp() -> str:
    """Two slides: a title each, a body line on the second."""
    master = '<style:master-page style:name="Default" style:page-layout-name="A4"/>'  # no layout

    def frame(y: str, text: str) -> str:
        return (
            f'<draw:frame svg:x="2cm" svg:y="{y}" svg:width="20cm" svg:height="3cm">'
            f"<draw:text-box><text:p>{escape(text)}</text:p></draw:text-box></draw:frame>"
        )

    slides = (
        f'<draw:page draw:name="one" draw:master-page-name="Default">'
        f"{frame('2cm', SLIDE_TITLES[0])}</draw:page>"
        f'<draw:page draw:name="two" draw:master-page-name="Default">'
        f"{frame('2cm', SLIDE_TITLES[1])}{frame('6cm', SLIDE_BODY)}</draw:page>"
    )
    body = f"<office:presentation>{slides}</office:presentation>"
    return _flat("application/vnd.oasis.opendocument.presentation", "", master, body)


# -- LibreOffice -------------------------------------------------------------------------


# The throwaway profile's one setting: the version it last ran, later than any
# LibreOffice's. Without it every start counts as the first after an upgrade and runs
# the graphics render tests (as pipelines.office_libreoffice says): ~1.05 CPU-s a
# conversion instead of ~0.33 (measured), a dozen conversions a session.
PROFILE_XCU = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry"\
 xmlns:xs="http://www.w3.org/2001/XMLSchema"\
 xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Setup/Product"><prop oor:name="ooSetupLastVersion"\
 oor:op="fuse"><value>99.9</value></prop></item>
</oor:items>
"""


def user_installation(profile: Path) -> str:
    """soffice's option for a profile in ``profile`` (made, with :data:`PROFILE_XCU`),
    marked with LibreOffice's build id as the steps' profiles are: unmarked, each
    conversion started soffice.bin twice (its launcher runs it again after its exit 81;
    ~0.11 CPU-s a conversion, :func:`pipelines.office_libreoffice.write_build_id`)."""
    (profile / "user").mkdir(parents=True)
    (profile / "user" / "registrymodifications.xcu").write_text(PROFILE_XCU, encoding="utf-8")
    write_build_id(profile / "user")
    return f"-env:UserInstallation={profile.as_uri()}"


def soffice_convert(sources: list[Path], target: str, outdir: Path) -> None:
    """LibreOffice headless converts ``sources`` to ``target`` (an extension, optionally
    with ``:filter:options``) into ``outdir``, with a throwaway profile of its own
    (:func:`user_installation`)."""
    soffice = shutil.which("soffice")
    assert soffice is not None, "LibreOffice (soffice) is needed to generate documents"
    with tempfile.TemporaryDirectory(prefix="hm-soffice-") as profile:
        subprocess.run(
            [
                soffice,
                "--headless",
                "--norestore",
                user_installation(Path(profile)),
                "--convert-to",
                target,
                "--outdir",
                str(outdir),
                *map(str, sources),
            ],
            check=True,
            capture_output=True,
            timeout=300,
            # Its temporary files in the throwaway directory (its pipe, OSL_PIPE_*, goes
            # to /tmp whatever TMPDIR says, and its normal exit removes it).
            env={**os.environ, "TMPDIR": profile},
        )
    extension = target.split(":", 1)[0]
    missing = [s.name for s in sources if not (outdir / f"{s.stem}.{extension}").is_file()]
    assert not missing, f"LibreOffice did not convert {missing} to {extension}"


# PDF export options (LibreOffice 7.4 reads them as JSON): a password to open it, and
# an owner password only (it opens; printing and changes are "restricted").
ENCRYPTED_PDF = (
    'pdf:writer_pdf_Export:{"EncryptFile":{"type":"boolean","value":"true"},'
    '"DocumentOpenPassword":{"type":"string","value":"secret"}}'
)
OWNER_PROTECTED_PDF = (
    'pdf:writer_pdf_Export:{"RestrictPermissions":{"type":"boolean","value":"true"},'
    '"PermissionPassword":{"type":"string","value":"owner"},'
    '"Printing":{"type":"long","value":"0"},"Changes":{"type":"long","value":"0"}}'
)


# -- PDFs by code ----------------------------------------------------------------------


def _literal(text: str) -> bytes:
    escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    return b"(" + escaped.encode("latin-1") + b")"


def text_pdf(
    pages: list[list[str]],
    *,
    media_box: tuple[int, int] = (612, 792),
    rotate: int = 0,
    catalog_extra: bytes = b"",
    page_extra: bytes = b"",
    missing_kids: int = 0,
) -> bytes:
    """A PDF of ``pages``, each a list of lines in Helvetica (a standard font: nothing
    embedded, and PDFium reads the text back). ``missing_kids`` page references point at
    objects that do not exist (a damaged page tree)."""
    count = len(pages)
    font = 3
    first_page = 4
    kids = [b"%d 0 R" % (first_page + 2 * i) for i in range(count)]
    absent = first_page + 2 * count
    kids[1:1] = [b"%d 0 R" % (absent + i) for i in range(missing_kids)]
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R %s>>" % catalog_extra,
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(kids), count + missing_kids),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    width, height = media_box
    for index, lines in enumerate(pages):
        stream = b"BT /F1 18 Tf 72 %d Td 22 TL " % (height - 90)
        stream += b"".join(_literal(line) + b" Tj T* " for line in lines) + b"ET"
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d] /Rotate %d"
            b" /Resources << /Font << /F1 %d 0 R >> >> /Contents %d 0 R %s>>"
            % (width, height, rotate, font, first_page + 2 * index + 1, page_extra)
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    return error_inputs.pdf(objects)


JAVASCRIPT = b"app.alert('generated'); this.print({bUI: false});"


def javascript_pdf() -> bytes:
    """A page that runs JavaScript when the document opens and when the page does."""
    action = b"<< /S /JavaScript /JS %s >>" % _literal(JAVASCRIPT.decode())
    return text_pdf(
        [[HELLO, "with an open action"]],
        catalog_extra=b"/OpenAction %s " % action,
        page_extra=b"/AA << /O %s >> " % action,
    )


def scan_pdf(path: Path) -> None:
    """A page that is one picture and no text (what a scanner gives): Pillow writes it."""
    from PIL import Image

    with Image.open(io.BytesIO(picture(400, 560).pngsave_buffer())) as opened:
        # Dates fixed: Pillow stamps the time of writing otherwise.
        stamp = time.gmtime(946_684_800)  # 2000-01-01
        opened.convert("RGB").save(
            path, format="PDF", resolution=72, creationDate=stamp, modDate=stamp
        )


# -- the group -----------------------------------------------------------------------------


def build(directory: Path) -> list[Entry]:
    out = directory / "documents"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hm-documents-") as scratch:
        sources = Path(scratch)
        report, pages, arabic = (
            sources / "report.fodt",
            sources / "pages-12.fodt",
            sources / "arabic.fodt",
        )
        four = sources / "pages-4.fodt"
        report.write_text(report_fodt(), encoding="utf-8")
        pages.write_text(pages_fodt(PAGES), encoding="utf-8")
        four.write_text(pages_fodt(4), encoding="utf-8")
        arabic.write_text(arabic_fodt(), encoding="utf-8")
        owner = sources / "owner-protected.fodt"
        owner.write_text(report_fodt(), encoding="utf-8")
        sheet, slides = sources / "budget.fods", sources / "slides.fodp"
        sheet.write_text(spreadsheet_fods(), encoding="utf-8")
        slides.write_text(presentation_fodp(), encoding="utf-8")
        conversions = [
            ([report, pages], "docx"),
            ([report], "odt"),
            ([report], "doc"),
            ([report], "rtf"),
            ([four, arabic], "pdf"),
            ([owner], OWNER_PROTECTED_PDF),
            *[([sheet], extension) for extension in ("xlsx", "xls", "ods")],
            *[([slides], extension) for extension in ("pptx", "ppt", "odp")],
        ]
        # Each LibreOffice start costs a second or two, mostly waiting: a few at once.
        with ThreadPoolExecutor(max_workers=4) as pool:
            done = [pool.submit(soffice_convert, s, target, out) for s, target in conversions]
            for future in done:
                future.result()
        shutil.copyfile(report, out / "report.fodt")
    (out / "hello.pdf").write_bytes(text_pdf([[HELLO, HELLO, "A second line"]]))
    (out / "portrait.pdf").write_bytes(text_pdf([[HELLO]], media_box=(612, 792)))
    (out / "rotated.pdf").write_bytes(text_pdf([[HELLO, "rotated"]], rotate=90))
    scan_pdf(out / "scan.pdf")

    def document(name: str, kind: str, note: str) -> Entry:
        return Entry(f"documents/{name}", f"document:{kind}", "valid", note)

    return [
        document("report.docx", "docx", "LibreOffice from report.fodt"),
        document("report.odt", "odt", "LibreOffice from report.fodt"),
        document("report.doc", "doc", "LibreOffice from report.fodt"),
        document("report.rtf", "rtf", "LibreOffice from report.fodt"),
        document("report.fodt", "fodt", "flat ODT written by the generator"),
        document("pages-12.docx", "docx", f"{PAGES} pages"),
        document("budget.xlsx", "xlsx", f"sheets {', '.join(SHEETS)}"),
        document("budget.xls", "xls", "LibreOffice from budget.fods"),
        document("budget.ods", "ods", "LibreOffice from budget.fods"),
        document("slides.pptx", "pptx", "two slides"),
        document("slides.ppt", "ppt", "LibreOffice from slides.fodp"),
        document("slides.odp", "odp", "LibreOffice from slides.fodp"),
        Entry("documents/pages-4.pdf", "pdf", "valid", "4 A4 pages, LibreOffice"),
        Entry("documents/arabic.pdf", "pdf", "valid", "Arabic text, LibreOffice"),
        Entry("documents/owner-protected.pdf", "pdf", "valid", "owner password only: it opens"),
        Entry("documents/hello.pdf", "pdf", "valid", "Helvetica text, by code"),
        Entry("documents/portrait.pdf", "pdf", "valid", "612x792 points, by code"),
        Entry("documents/rotated.pdf", "pdf", "valid", "/Rotate 90, by code"),
        Entry("documents/scan.pdf", "pdf", "valid", "one picture, no text (Pillow)"),
    ]
