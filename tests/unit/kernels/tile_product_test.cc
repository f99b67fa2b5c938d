#include "kernels/cpu/tile_product.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace ballast::kernels {
namespace {

// One product shape: C (rows, cols) (+)= alpha A B, with A read through
// (a_row, a_depth) strides and every leading dimension wider than its rows so
// that reading past a row's end would show.
struct Shape {
  int64_t rows, cols, depth;
  bool a_transposed;  // A stored (depth, rows): a_row = 1
  bool accumulate;
};

template <typename T>
void CheckAgainstFloat64(const Shape& s, double tolerance) {
  const auto dtype = std::is_same_v<T, float> ? torch::kFloat : torch::kDouble;
  const int64_t pad = 5;
  const at::Tensor a_store = s.a_transposed ? torch::randn({s.depth, s.rows + pad}, dtype)
                                            : torch::randn({s.rows, s.depth + pad}, dtype);
  const at::Tensor b = torch::randn({s.depth, s.cols + pad}, dtype);
  const at::Tensor c_init = torch::randn({s.rows, s.cols + pad}, dtype);
  at::Tensor c = c_init.clone();
  const T alpha = T(0.75);
  const int64_t a_row = s.a_transposed ? 1 : s.depth + pad;
  const int64_t a_depth = s.a_transposed ? s.rows + pad : 1;
  TileProduct(s.rows, s.cols, s.depth, alpha, a_store.data_ptr<T>(), a_row, a_depth,
              b.data_ptr<T>(), s.cols + pad, s.accumulate, c.data_ptr<T>(), s.cols + pad);

  const at::Tensor a =
      s.a_transposed ? a_store.narrow(1, 0, s.rows).t() : a_store.narrow(1, 0, s.depth);
  at::Tensor want = c_init.to(torch::kDouble);
  const at::Tensor product =
      0.75 * a.to(torch::kDouble).matmul(b.narrow(1, 0, s.cols).to(torch::kDouble));
  want.narrow(1, 0, s.cols).copy_(s.accumulate ? want.narrow(1, 0, s.cols) + product : product);
  const std::string where = "rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols) +
                            " depth " + std::to_string(s.depth) +
                            (s.a_transposed ? " A transposed" : " A row-major") +
                            (s.accumulate ? " accumulate" : " overwrite");
  const double scale = want.abs().max().item<double>() + 1.0;
  const double error = (c.to(torch::kDouble) - want).abs().max().item<double>();
  EXPECT_LE(error, tolerance * scale) << where;
  // The padding past `cols` is never written.
  EXPECT_TRUE(torch::equal(c.narrow(1, s.cols, pad), c_init.narrow(1, s.cols, pad))) << where;
}

// Rows around the 6-row register tile, columns around the 16-lane vectors and
// the 64-column panel, depths from 1 to the attention tiles' 256.
std::vector<Shape> Shapes() {
  std::vector<Shape> shapes;
  for (int64_t rows : {1, 5, 6, 7, 13, 128}) {
    for (int64_t cols : {1, 15, 16, 17, 64, 65, 136}) {
      for (int64_t depth : {1, 32, 256}) {
        for (bool transposed : {false, true}) {
          shapes.push_back({rows, cols, depth, transposed, (rows + cols + depth) % 2 == 0});
        }
      }
    }
  }
  return shapes;
}

TEST(TileProduct, Fp32MatchesFloat64Reference) {
  torch::manual_seed(11);
  if (!TileProductUsesRegisterKernel()) {
    std::cout << "fp32 products use BLAS on this machine (no AVX-512F, or "
                 "BALLAST_CPU_TILE_PRODUCT=blas)\n";
  }
  for (const Shape& s : Shapes()) CheckAgainstFloat64<float>(s, 1e-5);
}

// The ctest entries run this unset, with "blas", and with a value that is
// neither (tests/unit/CMakeLists.txt).
TEST(TileProduct, HonoursTheEnvironmentChoice) {
  const char* choice = std::getenv("BALLAST_CPU_TILE_PRODUCT");
  if (choice == nullptr) {
#if defined(__x86_64__) && defined(__GNUC__)
    EXPECT_EQ(TileProductUsesRegisterKernel(), __builtin_cpu_supports("avx512f") != 0);
#else
    EXPECT_FALSE(TileProductUsesRegisterKernel());
#endif
  } else if (std::string(choice) == "blas") {
    EXPECT_FALSE(TileProductUsesRegisterKernel());
  } else {
    try {
      TileProductUsesRegisterKernel();
      FAIL() << "BALLAST_CPU_TILE_PRODUCT=" << choice << " was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find("BALLAST_CPU_TILE_PRODUCT"),
                std::string::npos)
          << e.what_without_backtrace();
    }
  }
}

TEST(TileProduct, Fp64MatchesFloat64Reference) {
  torch::manual_seed(12);
  for (const Shape& s : Shapes()) CheckAgainstFloat64<double>(s, 1e-12);
}

}  // namespace
}  // namespace ballast::kernels
