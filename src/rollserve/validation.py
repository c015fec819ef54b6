"""Kept for existing imports: the JSON checks and field names live in
``rollserve.contract.validation`` (the contract the client ships with)."""

from rollserve.contract.validation import (
    INT64_MAX,
    INT64_MIN,
    MAX_JSON_DEPTH,
    JSONInputError,
    check_json,
    describe,
    field_name,
    parse_json,
)

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_JSON_DEPTH",
    "JSONInputError",
    "check_json",
    "describe",
    "field_name",
    "parse_json",
]
