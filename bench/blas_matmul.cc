// float32 matmuls for MindSpore's ops.Custom(func_type="aot"), computed by the OpenBLAS that ships
// inside NumPy's wheel. Each entry point takes a (..., m, k)-style pair with equal leading (batch)
// dimensions and loops cblas_sgemm over the batch. NN: a @ b, NT: a @ b^T, TN: a^T @ b.
// Built by bench/blas_matmul.py; see bench/README.md for why it exists.
#include <cstdint>

typedef int64_t blasint;   // NumPy's OpenBLAS is the ILP64 build (symbols end in 64_)
extern "C" void SGEMM(int order, int transa, int transb, blasint m, blasint n, blasint k, float alpha,
                      const float *a, blasint lda, const float *b, blasint ldb, float beta, float *c,
                      blasint ldc);

static int gemm(int nparam, void **params, int *ndims, int64_t **shapes, bool ta, bool tb) {
  if (nparam != 3 || ndims[0] < 2 || ndims[0] != ndims[1]) return 1;
  const int r = ndims[0];
  const int64_t *sa = shapes[0], *sb = shapes[1];
  int64_t batch = 1;
  for (int i = 0; i < r - 2; ++i) {
    if (sa[i] != sb[i]) return 2;
    batch *= sa[i];
  }
  const blasint ar = sa[r - 2], ac = sa[r - 1], br = sb[r - 2], bc = sb[r - 1];
  const blasint m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  if (k != (tb ? bc : br)) return 3;
  const float *a = static_cast<const float *>(params[0]);
  const float *b = static_cast<const float *>(params[1]);
  float *c = static_cast<float *>(params[2]);
  for (int64_t i = 0; i < batch; ++i)   // 101 row-major, 111 no-trans, 112 trans
    SGEMM(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, 1.0f, a + i * ar * ac, ac, b + i * br * bc, bc, 0.0f,
          c + i * m * n, n);
  return 0;
}

extern "C" int MatMulNN(int np, void **p, int *nd, int64_t **s, const char **, void *, void *) {
  return gemm(np, p, nd, s, false, false);
}
extern "C" int MatMulNT(int np, void **p, int *nd, int64_t **s, const char **, void *, void *) {
  return gemm(np, p, nd, s, false, true);
}
extern "C" int MatMulTN(int np, void **p, int *nd, int64_t **s, const char **, void *, void *) {
  return gemm(np, p, nd, s, true, false);
}
