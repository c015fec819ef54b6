"""Parse our own source files for the tests that scan them (layering, names).

CPython 3.11 before 3.11.8 can raise a spurious ``SystemError: AST constructor
recursion depth mismatch`` from ``ast.parse`` late in a long test session (its AST
converter's depth bookkeeping, gh-106905); the file is fine. Then it is parsed again
in a fresh interpreter and the tree comes back pickled.
"""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from pathlib import Path

_FRESH = "import ast, pickle, sys; p = sys.argv[1]; " \
         "sys.stdout.buffer.write(pickle.dumps(ast.parse(open(p).read(), p)))"


def parse_source(path: Path) -> ast.Module:
    text = path.read_text()
    try:
        return ast.parse(text, str(path))
    except SystemError:
        done = subprocess.run([sys.executable, "-c", _FRESH, str(path)], capture_output=True,
                              timeout=60, check=True)
        tree = pickle.loads(done.stdout)
        assert isinstance(tree, ast.Module)
        return tree
