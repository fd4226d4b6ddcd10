"""python -m mshelpers.doctor CONFIG.yaml ... (see the package docstring)."""
from .cli import main

raise SystemExit(main())
