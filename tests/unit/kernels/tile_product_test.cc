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
  double alpha;
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
  const T alpha = static_cast<T>(s.alpha);
  const int64_t a_row = s.a_transposed ? 1 : s.depth + pad;
  const int64_t a_depth = s.a_transposed ? s.rows + pad : 1;
  TileProduct(s.rows, s.cols, s.depth, alpha, a_store.data_ptr<T>(), a_row, a_depth,
              b.data_ptr<T>(), s.cols + pad, s.accumulate, c.data_ptr<T>(), s.cols + pad);

  const at::Tensor a =
      s.a_transposed ? a_store.narrow(1, 0, s.rows).t() : a_store.narrow(1, 0, s.depth);
  at::Tensor want = c_init.to(torch::kDouble);
  const at::Tensor product =
      s.alpha * a.to(torch::kDouble).matmul(b.narrow(1, 0, s.cols).to(torch::kDouble));
  want.narrow(1, 0, s.cols).copy_(s.accumulate ? want.narrow(1, 0, s.cols) + product : product);
  const std::string where =
      "rows " + std::to_string(s.rows) + " cols " + std::to_string(s.cols) + " depth " +
      std::to_string(s.depth) + (s.a_transposed ? " A transposed" : " A row-major") +
      (s.accumulate ? " accumulate" : " overwrite") + " alpha " + std::to_string(s.alpha);
  const double scale = want.abs().max().item<double>() + 1.0;
  const double error = (c.to(torch::kDouble) - want).abs().max().item<double>();
  EXPECT_LE(error, tolerance * scale) << where;
  // The padding past `cols` is never written.
  EXPECT_TRUE(torch::equal(c.narrow(1, s.cols, pad), c_init.narrow(1, s.cols, pad))) << where;
}

// Rows around the 6-row register tile, columns around the 16-lane vectors and
// the 64-column panel, depths from 1 to the attention tiles' 256, with alpha
// 0.75; then the sides brgemm takes (multiples of 16, A row-major, alpha 1)
// and the same sides with a transposed A or another alpha, which it leaves to
// the next kernel.
std::vector<Shape> Shapes() {
  std::vector<Shape> shapes;
  for (int64_t rows : {1, 5, 6, 7, 13, 128}) {
    for (int64_t cols : {1, 15, 16, 17, 64, 65, 136}) {
      for (int64_t depth : {1, 32, 256}) {
        for (bool transposed : {false, true}) {
          shapes.push_back({rows, cols, depth, transposed, (rows + cols + depth) % 2 == 0, 0.75});
        }
      }
    }
  }
  for (int64_t rows : {16, 64, 256}) {
    for (int64_t cols : {16, 128, 256}) {
      for (int64_t depth : {16, 64, 256}) {
        for (bool accumulate : {false, true}) {
          shapes.push_back({rows, cols, depth, false, accumulate, 1.0});
        }
        shapes.push_back({rows, cols, depth, true, true, 1.0});
        shapes.push_back({rows, cols, depth, false, true, -1.0});
      }
    }
  }
  return shapes;
}

// Runs on whichever kernel this process chose: the ctest entries run it with
// BALLAST_CPU_TILE_PRODUCT unset (brgemm where available), "register" and
// "blas" (tests/unit/CMakeLists.txt).
TEST(TileProduct, Fp32MatchesFloat64Reference) {
  torch::manual_seed(11);
  const TileKernel kernel = FloatTileKernel();
  std::cout << "fp32 tile products on " << TileKernelName(kernel) << "\n";
  int64_t brgemm_shapes = 0;
  for (const Shape& s : Shapes()) {
    brgemm_shapes += BrgemmTakes(s.rows, s.cols, s.depth, static_cast<float>(s.alpha),
                                 s.a_transposed ? s.rows + 5 : 1);
    CheckAgainstFloat64<float>(s, 1e-5);
  }
  // The shapes reach brgemm, and leave it some to pass on.
  EXPECT_EQ(brgemm_shapes, 3 * 3 * 3 * 2);
}

// The kernel each value of BALLAST_CPU_TILE_PRODUCT gives: the one asked for,
// or the next in the order brgemm, register, blas that this process can run.
TEST(TileProduct, HonoursTheEnvironmentChoice) {
  const char* env = std::getenv("BALLAST_CPU_TILE_PRODUCT");
  const std::string choice = env == nullptr ? "" : env;
  if (choice.empty() || choice == "brgemm") {
    EXPECT_EQ(FloatTileKernel(), BrgemmAvailable()           ? TileKernel::kBrgemm
                                 : RegisterKernelAvailable() ? TileKernel::kRegister
                                                             : TileKernel::kBlas);
  } else if (choice == "register") {
    EXPECT_EQ(FloatTileKernel(),
              RegisterKernelAvailable() ? TileKernel::kRegister : TileKernel::kBlas);
  } else if (choice == "blas") {
    EXPECT_EQ(FloatTileKernel(), TileKernel::kBlas);
  } else {
    try {
      FloatTileKernel();
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
