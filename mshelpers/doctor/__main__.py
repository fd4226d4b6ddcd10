"""python -m mshelpers.doctor CONFIG.yaml ... (see the package docstring)."""
import os
import sys

from .cli import main

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:
    # the reader closed the pipe (`... | head`): no traceback for the rest, and exit 1 as Python's own
    # guidance for EPIPE has it (the output was not all delivered)
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 1
raise SystemExit(code)
