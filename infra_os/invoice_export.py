"""An invoice as CSV and as PDF (fpdf2). Both are built from the stored lines only, so a closed
invoice exports the same way forever."""

import csv
import io

from fpdf import FPDF
from fpdf.enums import XPos, YPos

from infra_os.models import Invoice, InvoiceLine
from infra_os.services.billing import invoice_note

CSV_HEADER = ["line", "resource", "match", "description", "quantity", "unit", "unit_price",
              "amount", "currency"]
# The PDF's built-in fonts know Latin-1 only: anything else is shown as "?".
PDF_ENCODING = "latin-1"


def invoice_filename(invoice: Invoice, extension: str) -> str:
    return f"ogai-invoice-{invoice.tenant.name}-{invoice.month:%Y-%m}.{extension}"


def _lines(invoice: Invoice) -> list[InvoiceLine]:
    return sorted(invoice.lines.all(), key=lambda line: line.position)


def _decimal(value) -> str:
    return format(value, "f")


def invoice_csv(invoice: Invoice) -> str:
    """A header, one row per line, and a total row; numbers as exact decimal strings."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for line in _lines(invoice):
        writer.writerow([
            line.position, line.resource, line.match, line.description, _decimal(line.quantity),
            line.unit, _decimal(line.unit_price), _decimal(line.amount), invoice.currency,
        ])
    writer.writerow(["", "total", "", f"Total {invoice.tenant.name} {invoice.month:%Y-%m}", "",
                     "", "", _decimal(invoice.total), invoice.currency])
    return buffer.getvalue()


def _text(value) -> str:
    return str(value).encode(PDF_ENCODING, "replace").decode(PDF_ENCODING)


def invoice_pdf(invoice: Invoice) -> bytes:
    """One A4 page (or more) with the tenant, the month, the lines and the total."""
    pdf = FPDF(orientation="portrait", unit="mm", format="A4")
    pdf.set_title(_text(f"OGAI invoice {invoice.tenant.name} {invoice.month:%Y-%m}"))
    pdf.set_author("OGAI")
    # A fixed date: the same invoice gives the same file.
    pdf.set_creation_date(invoice.rated_at)
    pdf.set_auto_page_break(auto=True, margin=15)
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 16)
    pdf.cell(0, 10, _text(f"Invoice {invoice.month:%Y-%m}"), new_x=XPos.LMARGIN,
             new_y=YPos.NEXT)
    pdf.set_font("Helvetica", "", 10)
    tenant = invoice.tenant
    facts = [
        ("Tenant", f"{tenant.name}" + (f" ({tenant.display_name})" if tenant.display_name
                                       and tenant.display_name != tenant.name else "")),
        ("Month", f"{invoice.month:%Y-%m} in {invoice.time_zone}"),
        ("Period", f"{invoice.period_start:%Y-%m-%d %H:%M} to {invoice.period_end:%Y-%m-%d %H:%M}"
                   " UTC"),
        ("Plan", invoice.plan_name or "none"),
        ("State", invoice.get_state_display()),
        ("Rated at", f"{invoice.rated_at:%Y-%m-%d %H:%M} UTC"),
    ]
    for label, value in facts:
        pdf.cell(30, 6, _text(label), new_x=XPos.RIGHT, new_y=YPos.TOP)
        pdf.cell(0, 6, _text(value), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    pdf.ln(4)
    lines = _lines(invoice)
    if lines:
        with pdf.table(col_widths=(8, 78, 26, 24, 26, 28), text_align=(
                "RIGHT", "LEFT", "RIGHT", "LEFT", "RIGHT", "RIGHT"), line_height=5,
                first_row_as_headings=True) as table:
            table.row(["#", "Description", "Quantity", "Unit", "Unit price",
                       f"Amount ({invoice.currency})"])
            for line in lines:
                table.row([str(line.position), _text(line.description), _decimal(line.quantity),
                           _text(line.unit), _decimal(line.unit_price), _decimal(line.amount)])
    else:
        pdf.multi_cell(0, 6, "No usage was billed this month.", new_x=XPos.LMARGIN,
                       new_y=YPos.NEXT)
    pdf.ln(4)
    pdf.set_font("Helvetica", "B", 12)
    pdf.cell(0, 8, _text(f"Total: {_decimal(invoice.total)} {invoice.currency}"),
             new_x=XPos.LMARGIN, new_y=YPos.NEXT, align="R")
    note = invoice_note(invoice)
    if note:
        pdf.set_font("Helvetica", "I", 9)
        pdf.multi_cell(0, 5, _text(note), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    return bytes(pdf.output())
