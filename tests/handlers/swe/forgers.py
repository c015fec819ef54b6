"""Forgers the machinery scan's tests and the API's exploit tests share."""

# The generic forger, for the package the tests import (``calc/__init__.py``):
# every pytest report rewritten to a pass. Not a protected file, so only the canary (and
# the machinery scan, where it is on) sees it.
FORGE = """
import sys as _sys
if "_pytest.reports" in _sys.modules:
    from _pytest.reports import TestReport as _Report
    _made = _Report.from_item_and_call

    def _forged(item, call):
        report = _made(item, call)
        report.outcome, report.longrepr = "passed", None
        return report

    _Report.from_item_and_call = staticmethod(_forged)
"""
