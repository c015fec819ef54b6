"""Cell text: conversion, measurement and padding."""

from __future__ import annotations

import unicodedata
from typing import Any


def cell_text(value: Any) -> str:
    """The text shown for *value*: ``None`` is empty, newlines become spaces."""
    if value is None:
        return ""
    return str(value).replace("\r\n", " ").replace("\n", " ")


def display_width(text: str) -> int:
    """Number of terminal columns *text* occupies.

    East Asian wide and fullwidth characters take two columns; combining
    marks and zero-width characters take none.
    """
    width = 0
    for ch in text:
        if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def is_number(text: str) -> bool:
    """Tell whether *text* looks like a number (``12``, ``3.5``, ``1,200``)."""
    stripped = text.strip()
    if not stripped:
        return False
    return stripped.replace(",", "").replace(".", "", 1).isdigit()


def pad(text: str, width: int, align: str = "left") -> str:
    """Pad *text* with spaces to *width* display columns."""
    gap = max(width - display_width(text), 0)
    if align == "right":
        return " " * gap + text
    if align == "center":
        left = gap // 2
        return " " * left + text + " " * (gap - left)
    if align == "left":
        return text + " " * gap
    raise ValueError(f"unknown alignment: {align!r}")
