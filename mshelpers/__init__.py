"""mshelpers: small, copyable helpers for the MindSpore training-optimization cookbook.

Each module is one concern and imports MindSpore lazily, so `config`, `metrics`,
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


def _drop_mindformers_import_noise() -> None:
    """mindformers 1.9 logs 'Import PyNative...ForCausalLM failed: No module named hyper_parallel' for models
    this cookbook never uses (hyper_parallel is not on PyPI). Its logger is named 'mindformers' + LOG_MF_PATH;
    a filter on that name drops exactly those lines and nothing else."""
    import logging
    name = "mindformers" + _os.path.expanduser(_os.environ["LOG_MF_PATH"])
    logging.getLogger(name).addFilter(lambda record: "hyper_parallel" not in record.getMessage())


_drop_mindformers_import_noise()

__version__ = "0.1.0"
