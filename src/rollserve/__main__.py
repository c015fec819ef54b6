"""``python -m rollserve``: the same command line as ``rollserve``."""

from rollserve.cli import main

main()
