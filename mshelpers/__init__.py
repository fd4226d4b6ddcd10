"""mshelpers: small, copyable helpers for the MindSpore training-optimization cookbook.

Each module is one concern and imports MindSpore lazily, so `config`, `metrics`, `peak`,
`memory` and friends can be lifted into another project on their own.

Importing the package sets two quiet defaults (override them by setting the variables
before the import): MindSpore's C++ log level GLOG_v=3 (errors only; its deprecation
warnings otherwise fill every notebook cell) and mindformers' log folder under build/.
"""
import os as _os

_os.environ.setdefault("GLOG_v", "3")
_os.environ.setdefault("LOCAL_DEFAULT_PATH", _os.path.join(
    _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "build", "mindformers"))
_os.environ.setdefault("LOG_MF_PATH", _os.path.join(_os.environ["LOCAL_DEFAULT_PATH"], "log"))


from .model import quiet_mindformers as _quiet_mindformers   # noqa: E402  (light: no MindSpore at import)

_quiet_mindformers(level=None)     # the import-noise filter only; log levels stay mindformers' own

__version__ = "0.1.0"
