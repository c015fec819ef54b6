"""Renderers for the supported table styles."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Union

from .cells import cell_text, display_width, is_number, pad

Align = Union[str, Sequence[str]]
_ALIGNMENTS = ("left", "right", "center")


def render(headers: Sequence[Any], rows: Sequence[Sequence[Any]], style: str = "plain", align: Align = "auto") -> str:
    """Render *rows* under *headers* in *style* (see :data:`STYLES`)."""
    try:
        renderer = STYLES[style]
    except KeyError:
        raise ValueError(f"unknown style {style!r}; expected one of {sorted(STYLES)}") from None
    head = [cell_text(h) for h in headers]
    body = [[cell_text(c) for c in row] for row in rows]
    for row in body:
        if len(row) != len(head):
            raise ValueError(f"row has {len(row)} cells, expected {len(head)}: {row!r}")
    return renderer(head, body, _alignments(body, len(head), align))


def _alignments(body: List[List[str]], ncols: int, align: Align) -> List[str]:
    if isinstance(align, str) and align != "auto":
        aligns = [align] * ncols
    elif isinstance(align, str):
        aligns = []
        for col in range(ncols):
            values = [row[col] for row in body if row[col].strip()]
            aligns.append("right" if values and all(is_number(v) for v in values) else "left")
    else:
        aligns = list(align)
        if len(aligns) != ncols:
            raise ValueError(f"{len(aligns)} alignments for {ncols} columns")
    for a in aligns:
        if a not in _ALIGNMENTS:
            raise ValueError(f"unknown alignment: {a!r}")
    return aligns


def _widths(head: List[str], body: List[List[str]], minimum: int = 0) -> List[int]:
    return [
        max([minimum, display_width(head[col])] + [display_width(row[col]) for row in body])
        for col in range(len(head))
    ]


def render_plain(head: List[str], body: List[List[str]], aligns: List[str]) -> str:
    widths = _widths(head, body)
    lines = ["  ".join(pad(h, w, a) for h, w, a in zip(head, widths, aligns))]
    lines.append("  ".join("-" * w for w in widths))
    for row in body:
        lines.append("  ".join(pad(c, w, a) for c, w, a in zip(row, widths, aligns)))
    return "\n".join(line.rstrip() for line in lines)


def render_markdown(head: List[str], body: List[List[str]], aligns: List[str]) -> str:
    widths = _widths(head, body, minimum=3)

    def line(cells: List[str], row_aligns: List[str]) -> str:
        return "| " + " | ".join(pad(c, w, a) for c, w, a in zip(cells, widths, row_aligns)) + " |"

    rule = []
    for w, a in zip(widths, aligns):
        if a == "left":
            rule.append(":" + "-" * (w + 1))
        elif a == "right":
            rule.append("-" * (w + 1) + ":")
        else:
            rule.append(":" + "-" * w + ":")
    lines = [line(head, ["left"] * len(head)), "|" + "|".join(rule) + "|"]
    lines.extend(line(row, aligns) for row in body)
    return "\n".join(lines)


def render_grid(head: List[str], body: List[List[str]], aligns: List[str]) -> str:
    widths = _widths(head, body)

    def rule(char: str) -> str:
        return "+" + "+".join(char * (w + 2) for w in widths) + "+"

    def line(cells: List[str], row_aligns: List[str]) -> str:
        return "| " + " | ".join(pad(c, w, a) for c, w, a in zip(cells, widths, row_aligns)) + " |"

    lines = [rule("-"), line(head, ["left"] * len(head)), rule("=")]
    for row in body:
        lines.append(line(row, aligns))
    if body:
        lines.append(rule("-"))
    return "\n".join(lines)


Renderer = Callable[[List[str], List[List[str]], List[str]], str]

#: Style name -> renderer.
STYLES: Dict[str, Renderer] = {
    "plain": render_plain,
    "markdown": render_markdown,
    "grid": render_grid,
}
