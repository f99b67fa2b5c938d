// The BLAS products that LibTorch links and exports (MKL in the PyPI wheel),
// by their Fortran names: ATen's own C++ wrappers (at::native::cpublas) are
// not exported from libtorch_cpu. Column-major; every argument by pointer.
#ifndef BALLAST_KERNELS_CPU_FORTRAN_BLAS_H_
#define BALLAST_KERNELS_CPU_FORTRAN_BLAS_H_

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
            const double* beta, double* c, const int* ldc);
}

#endif  // BALLAST_KERNELS_CPU_FORTRAN_BLAS_H_
