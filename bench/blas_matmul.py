"""float32 matmuls for MindSpore computed by NumPy's bundled OpenBLAS, as `ops.Custom` AOT ops with gradients.

A benchmark candidate that lost (bench/README.md): single MatMul calls timed from Python suggested OpenBLAS was
about twice as fast as MindSpore's CPU kernel, but inside the compiled training graph MindSpore's MatMul ran at
125-130 GFLOP/s and this op made the step 39 % slower. `ops.Custom(func_type="aot")` is MindSpore's documented
way to bring a compiled kernel into a graph; the kernel here is bench/blas_matmul.cc, compiled once with g++.

Example:
    >>> from bench.blas_matmul import blas_matmul, blas_matmul_nt
    >>> c = blas_matmul(a, b)          # a (..., m, k), b (..., k, n), equal leading dims
    >>> s = blas_matmul_nt(q, k)       # q @ k^T over the last two dims
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
from mindspore import ops

_SRC = Path(__file__).with_name("blas_matmul.cc")
_SYMBOLS = ("cblas_sgemm64_", "scipy_cblas_sgemm64_")   # numpy 1.26 wheels, numpy 2.x wheels


def _openblas() -> tuple[str, str]:
    """(path of NumPy's bundled OpenBLAS, its ILP64 sgemm symbol)."""
    libdir = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for lib in sorted(glob.glob(str(libdir / "lib*openblas*.so*"))):
        handle = ctypes.CDLL(lib)
        for sym in _SYMBOLS:
            if hasattr(handle, sym):
                return lib, sym
    raise RuntimeError(f"no ILP64 OpenBLAS with {' or '.join(_SYMBOLS)} under {libdir}; fix: use the numpy wheel "
                       "from PyPI (requirements.txt pins numpy==1.26.4), whose numpy.libs/ holds it")


def build_library(out_dir: str | os.PathLike | None = None) -> Path:
    """Compile bench/blas_matmul.cc against NumPy's OpenBLAS (cached by source and library); return the .so path."""
    gxx = shutil.which("g++")
    if gxx is None:
        raise RuntimeError("g++ not found; fix: apt-get install g++ (needed only for this benchmark candidate)")
    lib, sym = _openblas()
    key = hashlib.sha1(_SRC.read_bytes() + lib.encode() + sym.encode()).hexdigest()[:12]
    out_dir = Path(out_dir or Path(__file__).resolve().parent.parent / "build" / "bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / f"blas_matmul-{key}.so"
    if not so.exists():
        tmp = so.with_suffix(f".{os.getpid()}.tmp")
        cmd = [gxx, "-O2", "-shared", "-fPIC", f"-DSGEMM={sym}", str(_SRC), "-o", str(tmp),
               f"-L{Path(lib).parent}", f"-l:{Path(lib).name}", f"-Wl,-rpath,{Path(lib).parent}"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"compiling {_SRC.name} failed: {res.stderr.strip().splitlines()[:3]}")
        os.replace(tmp, so)   # atomic: a concurrent build never sees half a library
    return so


def _same_dtype(a, b):
    return a


def _ops() -> tuple:
    so = str(build_library())

    def custom(name, shape, bprop=None):
        return ops.Custom(f"{so}:{name}", out_shape=shape, out_dtype=_same_dtype, func_type="aot", bprop=bprop)

    tn = custom("MatMulTN", lambda a, b: list(a[:-2]) + [a[-1], b[-1]])

    def nn_bprop(a, b, out, dout):   # c = a b:  da = dc b^T,  db = a^T dc
        return nt_op(dout, b), tn(a, dout)

    def nt_bprop(a, b, out, dout):   # c = a b^T:  da = dc b,  db = dc^T a
        return nn_op(dout, b), tn(dout, a)

    nn_op = custom("MatMulNN", lambda a, b: list(a[:-1]) + [b[-1]], nn_bprop)
    nt_op = custom("MatMulNT", lambda a, b: list(a[:-1]) + [b[-2]], nt_bprop)
    return nn_op, nt_op


blas_matmul, blas_matmul_nt = _ops()
