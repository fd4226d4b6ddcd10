"""python -m mshelpers.doctor CONFIG.yaml ... (see the package docstring); the console script `ms-doctor` is the same."""
from .cli import console

console()
