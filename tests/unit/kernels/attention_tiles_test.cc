// choose_attention_kernel (kernels/attention_tiles.h) on a table of cards,
// without a GPU: which implementation runs, with which tiles, and that every
// chosen tile fits the card's shared-memory opt-in limit.
#include "kernels/attention_tiles.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ballast::kernels {
namespace {

struct Card {
  const char* name;
  DeviceCaps caps;
};

// sharedMemPerBlockOptin as the CUDA programming guide lists it per
// compute capability.
const std::vector<Card> kCards = {
    {"T4 sm_75", {7, 5, 64 * 1024}},         {"A100 sm_80", {8, 0, 163 * 1024}},
    {"A10 sm_86", {8, 6, 99 * 1024}},        {"L4 sm_89", {8, 9, 99 * 1024}},
    {"H100 sm_90", {9, 0, 227 * 1024}},      {"B200 sm_100", {10, 0, 227 * 1024}},
    {"RTX 5090 sm_120", {12, 0, 99 * 1024}},
};

std::string What(const Card& card, int64_t d, at::ScalarType dtype) {
  return std::string(card.name) + " D=" + std::to_string(d) + " " + c10::toString(dtype);
}

TEST(AttentionTiles, EveryChosenTileFitsTheCardsSharedMemory) {
  for (const Card& card : kCards) {
    for (int64_t d : {64, 128, 256}) {
      for (auto dtype : {at::kBFloat16, at::kHalf}) {
        const AttentionChoice c =
            choose_attention_kernel(card.caps, d, dtype, MaskKind::kCausal, 0);
        const std::string what = What(card, d, dtype);
        if (card.caps.sm_major < 8) {
          EXPECT_EQ(c.impl, AttentionImpl::kSdpaFallback) << what;
          EXPECT_NE(c.reason.find("sm_80"), std::string::npos) << what << ": " << c.reason;
          continue;
        }
        ASSERT_EQ(c.impl, AttentionImpl::kKernel) << what << ": " << c.reason;
        EXPECT_TRUE(c.reason.empty()) << what;
        for (auto [pass, tile, bytes] : {std::tuple{AttentionPass::kForward, c.fwd, c.fwd_bytes},
                                         {AttentionPass::kQueryGrad, c.dq, c.dq_bytes},
                                         {AttentionPass::kKeyValueGrad, c.dkv, c.dkv_bytes}}) {
          EXPECT_GT(tile.rows, 0) << what;
          EXPECT_EQ(bytes, SmemBytes(pass, static_cast<int>(d), tile)) << what;
          EXPECT_LE(bytes, card.caps.smem_optin_bytes) << what;
        }
      }
    }
  }
}

TEST(AttentionTiles, LargeCardsGetTheLargeTilesAndSmallCardsTheSmallOnes) {
  // The table the CUDA kernels are compiled for (attention_tiles.h), as
  // (rows, cols) and bytes; sm_80 / 90 / 100 run the large variants, the
  // 99 KiB cards the small ones.
  struct Row {
    int64_t d;
    TileShape big_fwd, big_dq, big_dkv, small_fwd, small_dq, small_dkv;
  };
  const std::vector<Row> rows = {
      {64, {64, 64}, {64, 64}, {64, 64}, {64, 64}, {64, 64}, {64, 32}},
      {128, {64, 64}, {64, 64}, {64, 32}, {64, 32}, {32, 64}, {32, 32}},
      {256, {64, 32}, {32, 32}, {32, 32}, {32, 32}, {16, 32}, {16, 32}},
  };
  for (const Card& card : kCards) {
    if (card.caps.sm_major < 8) continue;
    const bool small = card.caps.smem_optin_bytes < 163 * 1024;
    for (const Row& r : rows) {
      const AttentionChoice c =
          choose_attention_kernel(card.caps, r.d, at::kBFloat16, MaskKind::kBlockDiffusion, 0);
      const std::string what = What(card, r.d, at::kBFloat16);
      ASSERT_EQ(c.impl, AttentionImpl::kKernel) << what;
      EXPECT_EQ(c.fwd, small ? r.small_fwd : r.big_fwd) << what;
      EXPECT_EQ(c.dq, small ? r.small_dq : r.big_dq) << what;
      EXPECT_EQ(c.dkv, small ? r.small_dkv : r.big_dkv) << what;
    }
  }
  // The review's figures: 63.5 KiB (forward, D = 64) to 142.5 KiB (forward, D = 256).
  EXPECT_EQ(SmemBytes(AttentionPass::kForward, 64, {64, 64}), 65024);
  EXPECT_EQ(SmemBytes(AttentionPass::kForward, 256, {64, 32}), 145920);
}

TEST(AttentionTiles, EverySmallVariantFitsNinetyNineKibibytes) {
  for (int d : {64, 128, 256}) {
    const TileVariants v = TileVariantsFor(d);
    EXPECT_LE(SmemBytes(AttentionPass::kForward, d, v.fwd.small), kSmallCardSmemBytes) << d;
    EXPECT_LE(SmemBytes(AttentionPass::kQueryGrad, d, v.dq.small), kSmallCardSmemBytes) << d;
    EXPECT_LE(SmemBytes(AttentionPass::kKeyValueGrad, d, v.dkv.small), kSmallCardSmemBytes) << d;
    EXPECT_LE(SmemBytes(AttentionPass::kForward, d, v.fwd.large), 163 * 1024) << d;
    EXPECT_LE(SmemBytes(AttentionPass::kQueryGrad, d, v.dq.large), 163 * 1024) << d;
    EXPECT_LE(SmemBytes(AttentionPass::kKeyValueGrad, d, v.dkv.large), 163 * 1024) << d;
  }
}

TEST(AttentionTiles, Fp32UnsupportedHeadDimsAndOldArchsFallBackWithAReason) {
  const DeviceCaps h100{9, 0, 227 * 1024};
  for (int64_t d : {64, 128, 256}) {
    const AttentionChoice c = choose_attention_kernel(h100, d, at::kFloat, MaskKind::kCausal, 0);
    EXPECT_EQ(c.impl, AttentionImpl::kSdpaFallback) << d;
    EXPECT_NE(c.reason.find("Float"), std::string::npos) << c.reason;
  }
  for (int64_t d : {80, 96, 32}) {
    const AttentionChoice c = choose_attention_kernel(h100, d, at::kBFloat16, MaskKind::kCausal, 0);
    EXPECT_EQ(c.impl, AttentionImpl::kSdpaFallback) << d;
    EXPECT_NE(c.reason.find("head dim"), std::string::npos) << c.reason;
  }
  // A card with less than 99 KiB: no variant of D = 256 fits, so the reason
  // names the bytes.
  const AttentionChoice tiny =
      choose_attention_kernel({8, 7, 48 * 1024}, 256, at::kHalf, MaskKind::kCausal, 0);
  EXPECT_EQ(tiny.impl, AttentionImpl::kSdpaFallback);
  EXPECT_NE(tiny.reason.find("bytes of shared memory"), std::string::npos) << tiny.reason;
}

TEST(AttentionTiles, MasksTheFallbackCannotExpressAreUnsupportedNotDense) {
  const DeviceCaps t4{7, 5, 64 * 1024};
  const AttentionChoice window = choose_attention_kernel(t4, 128, at::kHalf, MaskKind::kCausal, 64);
  EXPECT_EQ(window.impl, AttentionImpl::kUnsupported);
  EXPECT_NE(window.reason.find("sliding window"), std::string::npos) << window.reason;
  const AttentionChoice bd =
      choose_attention_kernel({9, 0, 227 * 1024}, 96, at::kBFloat16, MaskKind::kBlockDiffusion, 0);
  EXPECT_EQ(bd.impl, AttentionImpl::kUnsupported);
  EXPECT_NE(bd.reason.find("block-diffusion"), std::string::npos) << bd.reason;
  EXPECT_NE(bd.reason.find("head dim"), std::string::npos) << bd.reason;
  // The kernel itself takes any mask.
  EXPECT_EQ(choose_attention_kernel({8, 6, 99 * 1024}, 128, at::kHalf, MaskKind::kCausal, 64).impl,
            AttentionImpl::kKernel);
}

}  // namespace
}  // namespace ballast::kernels
