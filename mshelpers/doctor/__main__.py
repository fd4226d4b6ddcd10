"""python -m mshelpers.doctor CONFIG.yaml ... (see the package docstring)."""
import sys

from .cli import main

raise SystemExit(main())
