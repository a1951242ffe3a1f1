"""The self-contained HTML page: inline CSS, every image a data URI, no script, no external URL.

Numbers that tests (and other tools) read back carry ``data-*`` attributes, so the page can
be checked through its DOM rather than by string matching.
"""

from __future__ import annotations

import base64
import html

from curation.audit.images import Tile

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1f2933;background:#f5f7fa}
header{background:#102a43;color:#f0f4f8;padding:18px 28px}
header h1{margin:0 0 6px;font-size:22px} header p{margin:2px 0;font-size:13px;color:#bcccdc}
header code{color:#f0f4f8}
main{padding:8px 28px 40px;max-width:1320px}
section{background:#fff;border-radius:8px;padding:14px 20px;margin:16px 0;box-shadow:0 1px 3px rgba(0,0,0,.08)}
h2{font-size:18px;margin:4px 0 10px} h3{font-size:15px;margin:16px 0 8px}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{background:#f0f4f8;border-radius:8px;padding:10px 18px;min-width:110px}
.card b{display:block;font-size:24px} .card span{font-size:12px;color:#52606d;text-transform:uppercase}
.card.kept b{color:#2e7d32} .card.dropped b{color:#ef6c00} .card.error b{color:#c62828}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border-bottom:1px solid #e4e7eb;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f0f4f8} td.num{text-align:right;font-variant-numeric:tabular-nums}
img.chart{max-width:100%;height:auto;display:block;margin:8px 0}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:8px}
.gallery{display:grid;grid-template-columns:repeat(auto-fill,minmax(212px,1fr));gap:10px}
figure.tile{margin:0;background:#f0f4f8;border-radius:6px;padding:6px;overflow:hidden}
figure.tile img{display:block;margin:0 auto;max-width:200px;max-height:200px}
.ph{height:150px;display:flex;align-items:center;justify-content:center;text-align:center;padding:8px;
    background:repeating-linear-gradient(45deg,#fde8e8,#fde8e8 10px,#fbd5d5 10px,#fbd5d5 20px);
    color:#8a1c1c;font-size:12px;word-break:break-word;border-radius:4px}
figcaption{font-size:11px;color:#3e4c59;margin-top:4px;word-break:break-all}
figcaption .reason{font-weight:600}
.warn{background:#fff3cd;border-left:4px solid #f0b429;padding:8px 12px}
.note{color:#52606d;font-size:12px}
details pre{background:#f0f4f8;padding:10px;overflow:auto;font-size:12px}
code{font-size:12px}
"""


class Markup(str):
    """Text that is already HTML (not escaped again)."""


def esc(value) -> str:
    return value if isinstance(value, Markup) else html.escape(str(value), quote=True)


def data_uri(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def attrs(values: dict | None) -> str:
    return "".join(f' {k}="{esc(v)}"' for k, v in (values or {}).items() if v is not None)


def chart(png: bytes, alt: str, **data) -> Markup:
    return Markup(f'<img class="chart" src="{data_uri("image/png", png)}" alt="{esc(alt)}"{attrs(data)}>')


def table(
    header: list[str],
    rows: list[list],
    *,
    numeric: set[int] = frozenset(),
    table_attrs: dict | None = None,
    row_attrs: list[dict] | None = None,
) -> Markup:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(
            f'<td class="num">{esc(c)}</td>' if j in numeric else f"<td>{esc(c)}</td>" for j, c in enumerate(row)
        )
        body.append(f"<tr{attrs(row_attrs[i] if row_attrs else None)}>{cells}</tr>")
    return Markup(f"<table{attrs(table_attrs)}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def cards(items: list[tuple[str, int | str, str]], **data) -> Markup:
    """``(label, value, css class)`` big-number cards; each carries ``data-name`` / ``data-value``."""
    inner = "".join(
        f'<div class="card {esc(cls)}" data-name="{esc(label)}" data-value="{esc(value)}">'
        f"<b>{esc(value)}</b><span>{esc(label)}</span></div>"
        for label, value, cls in items
    )
    return Markup(f'<div class="cards"{attrs(data)}>{inner}</div>')


def tile(t: Tile) -> Markup:
    caption = "".join(f"<div{' class=reason' if i == 0 else ''}>{esc(line)}</div>" for i, line in enumerate(t.caption))
    if t.jpeg is not None:
        body = f'<img src="{data_uri("image/jpeg", t.jpeg)}" alt="{esc(t.key)}">'
    else:
        body = f'<div class="ph">{esc(t.placeholder)}</div>'
    meta = attrs(
        {
            "data-key": t.key,
            "data-status": t.status,
            "data-reason": t.reason,
            "data-placeholder": "true" if t.jpeg is None else None,
        }
    )
    return Markup(f'<figure class="tile"{meta}>{body}<figcaption>{caption}</figcaption></figure>')


def gallery(tiles: list[Tile], **data) -> Markup:
    return Markup(f'<div class="gallery"{attrs(data)}>{"".join(tile(t) for t in tiles)}</div>')


def section(id_: str, title: str, *parts: str, note: str = "") -> Markup:
    text = f'<p class="note">{esc(note)}</p>' if note else ""
    return Markup(f'<section id="{esc(id_)}"><h2>{esc(title)}</h2>{text}{"".join(parts)}</section>')


def document(title: str, header_lines: list[str], sections: list[str]) -> str:
    lines = "".join(f"<p>{esc(line)}</p>" for line in header_lines)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>"
        f"<body><header><h1>{esc(title)}</h1>{lines}</header><main>{''.join(sections)}</main></body></html>\n"
    )
