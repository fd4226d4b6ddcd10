"""One msrun rank of the doctor's CPU check, as a script msrun can start:
    msrun ... mshelpers/doctor/cpu_worker.py --cpu-check-worker --steps N
(a file inside a package cannot be run by path with relative imports, so this one imports the package)."""
import os
import sys

if __name__ == "__main__":
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
    try:
        from mshelpers.doctor.cpu_check import _cpu_check_worker
    except ImportError:                 # the doctor/ folder copied alone: import it as a top-level package
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from doctor.cpu_check import _cpu_check_worker
    raise SystemExit(_cpu_check_worker(sys.argv[1:]))
