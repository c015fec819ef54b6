"""The grader's parse survives CPython 3.11's spurious ``SystemError: AST constructor
recursion depth mismatch`` (gh-106905: it masked a harness rollout in a CI-like run)."""

from __future__ import annotations

import ast

import pytest

from rollserve.handlers.swe import python_ast


def _mismatch(source, mode="exec"):
    raise SystemError("AST constructor recursion depth mismatch (before=30, after=26)")


def test_a_parse_hit_by_the_mismatch_is_done_in_a_fresh_interpreter(monkeypatch):
    monkeypatch.setattr(ast, "parse", _mismatch)  # this process's parser is broken
    tree = python_ast.parse("def f():\n    return sys._getframe(1)\n")
    assert isinstance(tree, ast.Module) and tree.body[0].name == "f"
    assert ast.unparse(tree.body[0].body[0]) == "return sys._getframe(1)"


def test_a_source_that_does_not_parse_still_raises_its_error():
    with pytest.raises(SyntaxError):
        python_ast.parse("def (:\n")


def test_other_system_errors_are_not_hidden(monkeypatch):
    def broken(source, mode="exec"):
        raise SystemError("something else")

    monkeypatch.setattr(ast, "parse", broken)
    with pytest.raises(SystemError, match="something else"):
        python_ast.parse("x = 1\n")
