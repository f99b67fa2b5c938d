// Attention on CPU: FlashAttention-2 forward and backward over an IntervalMask.
//
// Inputs: q (T, Hq, D), k and v (T, Hkv, D); query head h reads kv head
// h / (Hq / Hkv). For each query head and each row i, with V(i) the keys the
// mask lets it see:
//   s_ij  = scale * q_i . k_j                    j in V(i)
//   lse_i = log sum_{j in V(i)} exp(s_ij)        kept, (Hq, T), for the backward
//   out_i = sum_{j in V(i)} exp(s_ij - lse_i) v_j
// A row with V(i) empty gets out_i = 0, lse_i = -inf, and gradient 0, never NaN.
//
// Forward. One work item is (query tile, query head); a query tile is
// kAttnBlockM rows, or kAttnShortBlockM in short segments (attention_cpu.h). It
// walks only the key tiles of kAttnBlockN columns that some row of the tile
// sees, keeps per row the running max m and sum l of exp(s - m), rescales the
// output accumulator when m grows, and divides by l at the end (online
// softmax). Tiles that every row sees whole are not masked; tiles no row sees
// are skipped; the rest (the diagonal of a causal mask) are masked element by
// element from the row's intervals. No dense mask exists.
//
// Backward. With P = exp(S - lse) recomputed tile by tile and
// Delta_i = dO_i . O_i:
//   dV_j = sum_i P_ij dO_i          dS_ij = P_ij (dO_i . v_j - Delta_i)
//   dK_j = scale sum_i dS_ij q_i    dQ_i  = scale sum_j dS_ij k_j
// One pass, five tile products per (query tile, key tile): S, dV, dP, dK, dQ.
// A work item is (closed group of tokens, query head), where a closed group is
// a document (both halves for block diffusion): no query sees a key outside
// its group, so the item owns every dQ, dK and dV row it writes, for its head.
// There are no atomics, the sums run in a fixed order whatever the thread
// count, and, as in ATen's CPU flash attention, parallelism is (groups x query
// heads). With grouped-query attention, dK and dV are made per query head and
// summed over each group at the end. (A pass for dK and dV by key tile and
// another for dQ by query tile would parallelise over tiles too, but computes
// S and dP twice: 7 products instead of 5.)
//
// Layout. Score tiles are kept key-major, S^T (keys x queries), so that every
// tile product reads its operands where they lie: Q^T and dO^T of the query
// tile are transposed once per query tile (and reused for every key tile it
// sees), and K, V, Q and dO rows are read in place. The softmax statistics
// then run down the columns, vectorised across queries. The products go to
// kernels/cpu/tile_product.h: oneDNN's brgemm where LibTorch has it, a
// register kernel that copies no operand where the CPU has AVX-512, BLAS
// elsewhere. brgemm has no alpha and no transposed A, so the scale is folded
// into Q^T (for S) and into dS (for dK and dQ): S, dV, dP and dK then have
// alpha 1 and a row-major A, and brgemm takes them; O += P V and dQ += dS K
// read P and dS transposed, which the register kernel does at no cost, so
// they go there.
//
// Precision. bf16 and fp16 inputs are converted to fp32 once; every product,
// sum and exp runs in fp32 (fp64 for fp64 inputs, so that finite differences
// can check the gradients). The fp32 exp is vectorised (kernels/cpu/vec8.h)
// and cloned for AVX2 where the CPU has it.
//
// Threads. Work items run on at::parallel_for's OpenMP threads, longest
// first; this file is built with OpenMP for that (kernels/CMakeLists.txt).
//
// Indexing. Every offset is int64: T * H * D exceeds 2^31 at long contexts.
#include "kernels/cpu/attention_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/tile_product.h"
#include "kernels/cpu/vec8.h"

namespace ballast::kernels {
namespace {

constexpr int64_t kBlockM = kAttnBlockM;
constexpr int64_t kBlockN = kAttnBlockN;
// Row stride of the key-major tiles (S^T, dP^T, Q^T, dO^T): the query columns
// padded past kBlockM. A 1024-byte stride would put every 4th row of a tile in
// the same L1 set, so that a product's 64-column panel of Q^T would thrash a
// quarter of the sets; 1088 bytes (17 lines) spreads the rows over all of them.
constexpr int64_t kLdT = kBlockM + 16;
// The column kernels work on kVec queries at a time (kernels/cpu/vec8.h); a
// tile's queries are padded to a multiple of kVec with zero rows of Q^T and
// dO^T, whose columns are computed and never read back.
static_assert(kBlockM > 0 && kBlockN > 0, "tiles must be non-empty");
static_assert(kBlockM % kVec == 0, "padded query columns stay within kBlockM");
static_assert(kAttnShortBlockM <= kBlockM, "the workspace holds the tallest query tile");

int64_t PaddedWidth(int64_t queries) { return (queries + kVec - 1) / kVec * kVec; }

// ---------------------------------------------------------------------------
// Column kernels over a key-major tile t (n rows of stride kLdT), for `width`
// query columns, a multiple of kVec.
// ---------------------------------------------------------------------------

// max_j t[j][i] into out[i].
BALLAST_ROW_KERNEL void ColumnMax(const float* t, int64_t n, int64_t width, float* out) {
  for (int64_t i = 0; i < width; i += kVec) {
    Store8(out + i, Vec8f{} - std::numeric_limits<float>::infinity());
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < width; i += kVec) {
      const Vec8f x = Load8(t + j * kLdT + i);
      const Vec8f best = Load8(out + i);
      Store8(out + i, x > best ? x : best);
    }
  }
}

void ColumnMax(const double* t, int64_t n, int64_t width, double* out) {
  std::fill(out, out + width, -std::numeric_limits<double>::infinity());
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < width; ++i) out[i] = std::max(out[i], t[j * kLdT + i]);
  }
}

// t[j][i] = exp(t[j][i] - shift[i]), and sum[i] = sum_j of the new t[j][i].
// -inf gives exactly 0 and NaN stays NaN (see Exp8).
BALLAST_ROW_KERNEL void ExpColumns8(float* t, int64_t n, int64_t width, const float* shift,
                                    float* sum) {
  for (int64_t i = 0; i < width; i += kVec) Store8(sum + i, Vec8f{});
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < width; i += kVec) {
      const Vec8f y = Exp8(Load8(t + j * kLdT + i) - Load8(shift + i));
      Store8(t + j * kLdT + i, y);
      Store8(sum + i, Load8(sum + i) + y);
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define BALLAST_HAS_WIDE_EXP 1
using Vec16f = float __attribute__((vector_size(64)));
using Vec16i = int32_t __attribute__((vector_size(64)));

// ExpColumns8 on AVX-512, 16 queries at a time and the last 8 as there. The
// exp is most of the softmax's time: at 8 floats it took 4.8x the time of
// ATen's (18% of this kernel at T = 32k, D = 64). Only this kernel has a
// 16-float body: GCC lowers 16-float compares combined with & and | (as in
// HideKeyFromQueries) lane by lane even for AVX-512, and every 16-float
// compare so for AVX2, so the row kernels stay at 8 floats.
__attribute__((target("avx512f"))) void ExpColumns16(float* t, int64_t n, int64_t width,
                                                     const float* shift, float* sum) {
  auto load = [](const float* p) {
    Vec16f x;
    std::memcpy(&x, p, sizeof x);
    return x;
  };
  auto store = [](float* p, Vec16f x) { std::memcpy(p, &x, sizeof x); };
  const int64_t wide = width - width % 16;
  std::fill(sum, sum + width, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    float* row = t + j * kLdT;
    for (int64_t i = 0; i < wide; i += 16) {
      const Vec16f y = ExpLanes<Vec16f, Vec16i>(load(row + i) - load(shift + i));
      store(row + i, y);
      store(sum + i, load(sum + i) + y);
    }
    for (int64_t i = wide; i < width; i += kVec) {
      const Vec8f y = Exp8(Load8(row + i) - Load8(shift + i));
      Store8(row + i, y);
      Store8(sum + i, Load8(sum + i) + y);
    }
  }
}
#endif

void ExpColumns(float* t, int64_t n, int64_t width, const float* shift, float* sum) {
#ifdef BALLAST_HAS_WIDE_EXP
  static const bool wide = __builtin_cpu_supports("avx512f");
  if (wide) return ExpColumns16(t, n, width, shift, sum);
#endif
  ExpColumns8(t, n, width, shift, sum);
}

void ExpColumns(double* t, int64_t n, int64_t width, const double* shift, double* sum) {
  std::fill(sum, sum + width, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < width; ++i) {
      t[j * kLdT + i] = std::exp(t[j * kLdT + i] - shift[i]);
      sum[i] += t[j * kLdT + i];
    }
  }
}

// dp[j][i] = scale * p[j][i] * (dp[j][i] - delta[i]): dP^T becomes scale dS^T
// in place, the scale that both dK and dQ carry.
BALLAST_ROW_KERNEL void SoftmaxGradColumns(float* dp, const float* p, int64_t n, int64_t width,
                                           const float* delta, float scale) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < width; i += kVec) {
      const int64_t at = j * kLdT + i;
      Store8(dp + at, (Load8(p + at) * scale) * (Load8(dp + at) - Load8(delta + i)));
    }
  }
}

void SoftmaxGradColumns(double* dp, const double* p, int64_t n, int64_t width, const double* delta,
                        double scale) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < width; ++i) {
      dp[j * kLdT + i] = scale * p[j * kLdT + i] * (dp[j * kLdT + i] - delta[i]);
    }
  }
}

// row[i] = -inf where key j is outside query i's intervals [lo0, hi0) and
// [lo1, hi1).
BALLAST_ROW_KERNEL void HideKeyFromQueries(float* row, float j, const float* lo0, const float* hi0,
                                           const float* lo1, const float* hi1, int64_t width) {
  const Vec8f key = Vec8f{} + j;
  const Vec8f hidden = Vec8f{} - std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < width; i += kVec) {
    const Vec8i seen = ((Load8(lo0 + i) <= key) & (key < Load8(hi0 + i))) |
                       ((Load8(lo1 + i) <= key) & (key < Load8(hi1 + i)));
    Store8(row + i, seen ? Load8(row + i) : hidden);
  }
}

void HideKeyFromQueries(double* row, double j, const double* lo0, const double* hi0,
                        const double* lo1, const double* hi1, int64_t width) {
  for (int64_t i = 0; i < width; ++i) {
    const bool seen = (lo0[i] <= j && j < hi0[i]) || (lo1[i] <= j && j < hi1[i]);
    if (!seen) row[i] = -std::numeric_limits<double>::infinity();
  }
}

// x[0, n) *= a, for rows of any length (n = D).
BALLAST_ROW_KERNEL void ScaleRow(float* x, float a, int64_t n) {
  int64_t j = 0;
  for (; j + kVec <= n; j += kVec) Store8(x + j, Load8(x + j) * a);
  for (; j < n; ++j) x[j] *= a;
}

void ScaleRow(double* x, double a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] *= a;
}

// dst (D, kLdT) = a times the transpose of src (m, D) with row stride ld, and
// zero in the padding columns [m, width).
template <typename T>
void TransposeTile(const T* src, int64_t m, int64_t d, int64_t ld, int64_t width, T a, T* dst) {
  for (int64_t c = 0; c < d; ++c) {
    T* column = dst + c * kLdT;
    for (int64_t i = 0; i < m; ++i) column[i] = a * src[i * ld + c];
    std::fill(column + m, column + width, T(0));
  }
}

// ---------------------------------------------------------------------------
// Tiles and their visibility
// ---------------------------------------------------------------------------

struct Span {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Up to two disjoint ascending spans.
struct Spans {
  std::array<Span, 2> span;
  int count = 0;
  int64_t total() const {
    return count == 0 ? 0 : span[0].size() + (count == 2 ? span[1].size() : 0);
  }
};

// The indices any row of `rows` lists in `ranges` (T, 4): the union of each
// interval slot over the rows, the two merged when they meet.
Spans UnionOfRanges(const int64_t* ranges, Span rows) {
  std::array<Span, 2> hull;
  std::array<bool, 2> seen = {false, false};
  for (int64_t i = rows.begin; i < rows.end; ++i) {
    for (int slot = 0; slot < 2; ++slot) {
      const int64_t lo = ranges[4 * i + 2 * slot];
      const int64_t hi = ranges[4 * i + 2 * slot + 1];
      if (lo >= hi) continue;
      hull[slot] = seen[slot] ? Span{std::min(hull[slot].begin, lo), std::max(hull[slot].end, hi)}
                              : Span{lo, hi};
      seen[slot] = true;
    }
  }
  Spans out;
  for (int slot = 0; slot < 2; ++slot) {
    if (seen[slot]) out.span[out.count++] = hull[slot];
  }
  if (out.count == 2) {
    Span& a = out.span[0];
    Span& b = out.span[1];
    if (a.begin <= b.end && b.begin <= a.end) {
      a = {std::min(a.begin, b.begin), std::max(a.end, b.end)};
      out.count = 1;
    } else if (b.begin < a.begin) {
      std::swap(a, b);
    }
  }
  return out;
}

enum class Coverage { kNone, kPartial, kFull };

// How the rows see the key columns `cols`, from the rows' key intervals.
Coverage Classify(const int64_t* key_ranges, Span rows, Span cols) {
  bool any = false;
  bool all = true;
  for (int64_t i = rows.begin; i < rows.end; ++i) {
    const int64_t* r = key_ranges + 4 * i;
    const bool full =
        (r[0] <= cols.begin && cols.end <= r[1]) || (r[2] <= cols.begin && cols.end <= r[3]);
    const bool some = (std::max(r[0], cols.begin) < std::min(r[1], cols.end)) ||
                      (std::max(r[2], cols.begin) < std::min(r[3], cols.end));
    any |= some;
    all &= full;
  }
  return !any ? Coverage::kNone : (all ? Coverage::kFull : Coverage::kPartial);
}

// ---------------------------------------------------------------------------
// Problem, work items, workspaces
// ---------------------------------------------------------------------------

template <typename T>
struct Problem {
  const T* q;  // (T, Hq, D)
  const T* k;  // (T, Hkv, D)
  const T* v;  // (T, Hkv, D)
  int64_t num_tokens;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  const int64_t* key_ranges;  // (T, 4)
  T scale;

  int64_t ldq() const { return num_heads * head_dim; }
  int64_t ldk() const { return num_kv_heads * head_dim; }
  int64_t group() const { return num_heads / num_kv_heads; }
};

// A query tile of kBlockM rows inside one segment, with the spans of keys
// that some row of it sees.
struct QueryTile {
  Span rows;
  Spans keys;
  int64_t cost;  // rows x keys: the score elements it computes per head
};

// Cuts every segment into query tiles, dropping tiles whose rows see no key.
// Tiles come out in token order.
std::vector<QueryTile> MakeQueryTiles(const std::vector<int64_t>& segments,
                                      const int64_t* key_ranges) {
  std::vector<QueryTile> tiles;
  for (size_t s = 0; s + 1 < segments.size(); ++s) {
    const int64_t length = segments[s + 1] - segments[s];
    const int64_t block = length >= kAttnLongSegment ? kBlockM : kAttnShortBlockM;
    for (int64_t b = segments[s]; b < segments[s + 1]; b += block) {
      const Span rows{b, std::min(b + block, segments[s + 1])};
      const Spans keys = UnionOfRanges(key_ranges, rows);
      if (keys.count != 0) tiles.push_back({rows, keys, rows.size() * keys.total()});
    }
  }
  return tiles;
}

// Consecutive query tiles [tiles.begin, tiles.end) of one query head.
struct WorkItem {
  Span tiles;
  int64_t head;
  int64_t cost;
};

// One work item per (run of tiles, query head), most costly first: causal
// tiles differ in cost by up to T / kBlockN, and starting the longest first
// keeps the last thread from finishing alone.
std::vector<WorkItem> MakeWorkItems(const std::vector<QueryTile>& tiles,
                                    const std::vector<Span>& runs, int64_t num_heads) {
  std::vector<WorkItem> items;
  for (const Span& run : runs) {
    int64_t cost = 0;
    for (int64_t t = run.begin; t < run.end; ++t) cost += tiles[t].cost;
    for (int64_t h = 0; h < num_heads; ++h) items.push_back({run, h, cost});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  return items;
}

// Each tile alone: the forward's runs.
std::vector<Span> SingleTileRuns(const std::vector<QueryTile>& tiles) {
  std::vector<Span> runs;
  for (int64_t t = 0; t < static_cast<int64_t>(tiles.size()); ++t) runs.push_back({t, t + 1});
  return runs;
}

// The backward's runs: the tiles of each closed group of tokens, a set of
// consecutive segments whose queries see keys only inside it (a document; both
// halves of a block-diffusion document). One work item then owns the dQ, dK and
// dV rows of its group for its head, so there are no atomics and the sums run
// in a fixed order.
std::vector<Span> ClosedGroupRuns(const std::vector<QueryTile>& tiles) {
  std::vector<Span> runs;    // tile indices
  std::vector<Span> tokens;  // the tokens each run covers, queries and keys
  for (int64_t t = 0; t < static_cast<int64_t>(tiles.size()); ++t) {
    Span hull = tiles[t].rows;
    for (int i = 0; i < tiles[t].keys.count; ++i) {
      hull = {std::min(hull.begin, tiles[t].keys.span[i].begin),
              std::max(hull.end, tiles[t].keys.span[i].end)};
    }
    Span run{t, t + 1};
    // Fold in every earlier run this tile's tokens reach back into.
    while (!tokens.empty() && hull.begin < tokens.back().end) {
      hull = {std::min(hull.begin, tokens.back().begin), std::max(hull.end, tokens.back().end)};
      run.begin = runs.back().begin;
      runs.pop_back();
      tokens.pop_back();
    }
    runs.push_back(run);
    tokens.push_back(hull);
  }
  return runs;
}

// Calls worker(claim) once on each intra-op thread; claim() hands out the
// item indices 0 .. num_items - 1 in order, then -1.
template <typename Worker>
void ParallelOverItems(int64_t num_items, const Worker& worker) {
  std::atomic<int64_t> next{0};
  const int64_t num_workers = std::min<int64_t>(at::get_num_threads(), num_items);
  at::parallel_for(0, num_workers, 1, [&](int64_t, int64_t) {
    worker([&]() -> int64_t {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      return i < num_items ? i : -1;
    });
  });
}

template <typename T>
struct Workspace {
  explicit Workspace(int64_t head_dim)
      : qt(head_dim * kLdT, T(0)),
        dot(head_dim * kLdT, T(0)),
        st(kBlockN * kLdT, T(0)),
        dpt(kBlockN * kLdT, T(0)),
        acc(kBlockM * head_dim, T(0)),
        running_max(kLdT, T(0)),
        running_sum(kLdT, T(0)),
        shift(kLdT, T(0)),
        tile_sum(kLdT, T(0)),
        delta(kLdT, T(0)),
        seen(4 * kLdT, T(0)) {}
  std::vector<T> qt;           // (D, kLdT) Q^T of the query tile
  std::vector<T> dot;          // (D, kLdT) dO^T of the query tile
  std::vector<T> st;           // (kBlockN, kLdT) S^T, then P^T
  std::vector<T> dpt;          // (kBlockN, kLdT) dP^T, then dS^T
  std::vector<T> acc;          // (kBlockM, D) O or dQ
  std::vector<T> running_max;  // per query: m of the online softmax
  std::vector<T> running_sum;  // per query: l of the online softmax
  std::vector<T> shift;        // per query: what this key tile's exp subtracts
  std::vector<T> tile_sum;     // per query: this key tile's sum of exp
  std::vector<T> delta;        // per query: Delta = dO . O
  std::vector<T> seen;         // per query: its key intervals in the key tile, see HideUnseen
};

// Sets to -inf the entries of the key-major tile st (n, kLdT) that the mask
// hides: key j is seen by query i when lo0 <= j < hi0 or lo1 <= j < hi1, with
// the query's key intervals taken relative to the tile's first key and clamped
// to [0, n]. They are small integers, exact in T, so a row of keys is masked
// kVec queries at a time. Padding queries see nothing.
template <typename T>
void HideUnseen(const int64_t* key_ranges, Span rows, Span cols, int64_t width, T* seen, T* st) {
  const int64_t n = cols.size();
  T* bounds[4] = {seen, seen + kLdT, seen + 2 * kLdT, seen + 3 * kLdT};
  for (int64_t i = 0; i < width; ++i) {
    for (int b = 0; b < 4; ++b) {
      bounds[b][i] = i < rows.size()
                         ? static_cast<T>(std::clamp(
                               key_ranges[4 * (rows.begin + i) + b] - cols.begin, int64_t{0}, n))
                         : T(0);
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    HideKeyFromQueries(st + j * kLdT, static_cast<T>(j), bounds[0], bounds[1], bounds[2], bounds[3],
                       width);
  }
}

// st (n, kLdT) = scale * K Q^T for the tile, key-major, over the padded query
// columns, with the queries a key is hidden from set to -inf. Needs ws.qt,
// which holds scale * Q^T.
template <typename T>
void ScoreTile(const Problem<T>& p, const T* k_tile, Span rows, Span cols, Coverage coverage,
               const T* qt, T* seen, T* st) {
  const int64_t n = cols.size();
  TileProduct(n, PaddedWidth(rows.size()), p.head_dim, T(1), k_tile, p.ldk(), 1, qt, kLdT, false,
              st, kLdT);
  if (coverage != Coverage::kFull)
    HideUnseen(p.key_ranges, rows, cols, PaddedWidth(rows.size()), seen, st);
}

// ---------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------

template <typename T>
void ForwardTile(const Problem<T>& p, const QueryTile& tile, int64_t h, T* out, T* lse,
                 Workspace<T>& ws) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const Span rows = tile.rows;
  const int64_t m = rows.size();
  const int64_t width = PaddedWidth(m);
  const int64_t d = p.head_dim;
  const int64_t g = h / p.group();
  T* st = ws.st.data();
  T* o = ws.acc.data();  // (m, D)
  T* running_max = ws.running_max.data();
  T* running_sum = ws.running_sum.data();
  T* shift = ws.shift.data();
  T* tile_sum = ws.tile_sum.data();
  TransposeTile(p.q + rows.begin * p.ldq() + h * d, m, d, p.ldq(), width, p.scale, ws.qt.data());
  std::fill(o, o + m * d, T(0));
  std::fill(running_max, running_max + width, kNegInf);
  std::fill(running_sum, running_sum + width, T(0));

  for (int si = 0; si < tile.keys.count; ++si) {
    const Span keys = tile.keys.span[si];
    for (int64_t c = keys.begin; c < keys.end; c += kBlockN) {
      const Span cols{c, std::min(c + kBlockN, keys.end)};
      const Coverage coverage = Classify(p.key_ranges, rows, cols);
      if (coverage == Coverage::kNone) continue;
      const int64_t n = cols.size();
      const T* k_tile = p.k + cols.begin * p.ldk() + g * d;  // (n, D), row stride ldk
      const T* v_tile = p.v + cols.begin * p.ldk() + g * d;  // (n, D), row stride ldk
      ScoreTile(p, k_tile, rows, cols, coverage, ws.qt.data(), ws.seen.data(), st);
      ColumnMax(st, n, width, shift);
      for (int64_t i = 0; i < width; ++i) {
        const T new_max = std::max(running_max[i], shift[i]);
        // While a query has seen no key its max is -inf; shifting by 0 instead
        // avoids -inf - -inf, which is NaN, and exp(-inf - 0) is the 0 we want.
        shift[i] = new_max == kNegInf ? T(0) : new_max;
        const T rescale = std::exp(running_max[i] - shift[i]);
        running_max[i] = new_max;
        running_sum[i] *= rescale;
        if (i < m && rescale != T(1)) ScaleRow(o + i * d, rescale, d);
      }
      ExpColumns(st, n, width, shift, tile_sum);
      for (int64_t i = 0; i < width; ++i) running_sum[i] += tile_sum[i];
      // o (m, D) += P V, with P (i, j) = st[j][i]
      TileProduct(m, d, n, T(1), st, 1, kLdT, v_tile, p.ldk(), true, o, d);
    }
  }

  for (int64_t i = 0; i < m; ++i) {
    // l == 0 only for a query that saw no key: output 0, lse -inf. A NaN l
    // propagates.
    const bool empty = running_sum[i] == T(0);
    const T inv = empty ? T(0) : T(1) / running_sum[i];
    T* dst = out + (rows.begin + i) * p.ldq() + h * d;
    for (int64_t c = 0; c < d; ++c) dst[c] = o[i * d + c] * inv;
    lse[h * p.num_tokens + rows.begin + i] =
        empty ? kNegInf : running_max[i] + std::log(running_sum[i]);
  }
}

// ---------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------

template <typename T>
struct Upstream {
  const T* grad_out;  // (T, Hq, D)
  const T* lse;       // (Hq, T)
  const T* delta;     // (Hq, T): rowsum(dO * O)
};

// Where one query head's dK and dV rows accumulate: straight into the
// gradients when each kv head has one query head, otherwise into that query
// head's slice of (T, Hq, D) buffers that are summed over each group at the
// end, so that the query heads of a group never write the same rows.
template <typename T>
struct KeyValueGrads {
  T* dk;  // (T, Hq, D) per query head, or (T, Hkv, D)
  T* dv;  // likewise
  bool per_query_head;

  // Offset of token j's row for query head h.
  int64_t offset(const Problem<T>& p, int64_t j, int64_t h) const {
    return per_query_head ? j * p.ldq() + h * p.head_dim : j * p.ldk() + h / p.group() * p.head_dim;
  }
  int64_t ld(const Problem<T>& p) const { return per_query_head ? p.ldq() : p.ldk(); }
};

// dQ of one query tile of head h, and its terms of dK and dV, over every key
// tile the tile's rows see.
template <typename T>
void GradTile(const Problem<T>& p, const Upstream<T>& up, const QueryTile& tile, int64_t h,
              T* grad_q, const KeyValueGrads<T>& kv, Workspace<T>& ws) {
  const Span rows = tile.rows;
  const int64_t m = rows.size();
  const int64_t width = PaddedWidth(m);
  const int64_t d = p.head_dim;
  const int64_t g = h / p.group();
  const T* q_tile = p.q + rows.begin * p.ldq() + h * d;           // (m, D)
  const T* do_tile = up.grad_out + rows.begin * p.ldq() + h * d;  // (m, D)
  T* st = ws.st.data();
  T* dpt = ws.dpt.data();
  T* dq = ws.acc.data();  // (m, D)
  T* shift = ws.shift.data();
  T* delta = ws.delta.data();
  const int64_t ld_kv = kv.ld(p);
  TransposeTile(q_tile, m, d, p.ldq(), width, p.scale, ws.qt.data());
  TransposeTile(do_tile, m, d, p.ldq(), width, T(1), ws.dot.data());
  std::fill(dq, dq + m * d, T(0));
  // P = exp(S - lse). A query with lse = -inf saw no key in the forward;
  // shifting it by +inf instead gives P = 0 rather than exp(-inf - -inf) = NaN.
  // The padding columns get P = 0 the same way.
  for (int64_t i = 0; i < width; ++i) {
    const T lse_i =
        i < m ? up.lse[h * p.num_tokens + rows.begin + i] : -std::numeric_limits<T>::infinity();
    shift[i] =
        lse_i == -std::numeric_limits<T>::infinity() ? std::numeric_limits<T>::infinity() : lse_i;
    delta[i] = i < m ? up.delta[h * p.num_tokens + rows.begin + i] : T(0);
  }

  for (int si = 0; si < tile.keys.count; ++si) {
    const Span keys = tile.keys.span[si];
    for (int64_t c = keys.begin; c < keys.end; c += kBlockN) {
      const Span cols{c, std::min(c + kBlockN, keys.end)};
      const Coverage coverage = Classify(p.key_ranges, rows, cols);
      if (coverage == Coverage::kNone) continue;
      const int64_t n = cols.size();
      const T* k_tile = p.k + cols.begin * p.ldk() + g * d;  // (n, D)
      const T* v_tile = p.v + cols.begin * p.ldk() + g * d;  // (n, D)
      T* dk = kv.dk + kv.offset(p, cols.begin, h);           // (n, D), row stride ld_kv
      T* dv = kv.dv + kv.offset(p, cols.begin, h);           // (n, D), row stride ld_kv
      ScoreTile(p, k_tile, rows, cols, coverage, ws.qt.data(), ws.seen.data(), st);
      ExpColumns(st, n, width, shift, ws.tile_sum.data());
      // dv (n, D) += P^T dO
      TileProduct(n, d, m, T(1), st, kLdT, 1, do_tile, p.ldq(), true, dv, ld_kv);
      // dpt (n, width) = V dO^T
      TileProduct(n, width, d, T(1), v_tile, p.ldk(), 1, ws.dot.data(), kLdT, false, dpt, kLdT);
      SoftmaxGradColumns(dpt, st, n, width, delta, p.scale);
      // dk (n, D) += scale dS^T Q
      TileProduct(n, d, m, T(1), dpt, kLdT, 1, q_tile, p.ldq(), true, dk, ld_kv);
      // dq (m, D) += scale dS K, with dS (i, j) = dpt[j][i]
      TileProduct(m, d, n, T(1), dpt, 1, kLdT, k_tile, p.ldk(), true, dq, d);
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    std::copy(dq + i * d, dq + (i + 1) * d, grad_q + (rows.begin + i) * p.ldq() + h * d);
  }
}

// ---------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------

at::ScalarType ComputeType(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::vector<int64_t> ToVector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.const_data_ptr<int64_t>(), c.const_data_ptr<int64_t>() + c.numel());
}

template <typename T>
Problem<T> MakeProblem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const IntervalMask& mask, double scale) {
  return Problem<T>{q.const_data_ptr<T>(),
                    k.const_data_ptr<T>(),
                    v.const_data_ptr<T>(),
                    q.size(0),
                    q.size(1),
                    k.size(1),
                    q.size(2),
                    mask.key_ranges.const_data_ptr<int64_t>(),
                    static_cast<T>(scale)};
}

}  // namespace

IntervalMask interval_mask(const AttentionMask& mask, int64_t num_tokens) {
  const std::vector<int64_t> cu = ToVector(mask.cu_seqlens);
  at::Tensor key_ranges = at::empty({num_tokens, 4}, at::TensorOptions().dtype(at::kLong));
  at::Tensor query_ranges = at::empty({num_tokens, 4}, at::TensorOptions().dtype(at::kLong));
  int64_t* kr = key_ranges.mutable_data_ptr<int64_t>();
  int64_t* qr = query_ranges.mutable_data_ptr<int64_t>();
  auto set = [](int64_t* row, int64_t lo0, int64_t hi0, int64_t lo1, int64_t hi1) {
    row[0] = lo0;
    row[1] = hi0;
    row[2] = lo1;
    row[3] = hi1;
  };
  std::vector<int64_t> segments = {0};
  for (size_t doc = 0; doc + 1 < cu.size(); ++doc) {
    const int64_t begin = cu[doc];
    const int64_t end = cu[doc + 1];
    if (mask.kind == MaskKind::kCausal) {
      segments.push_back(end);
      for (int64_t i = begin; i < end; ++i) {
        // Query i sees (i - window, i]; key i is seen by [i, i + window).
        const int64_t lo = mask.window > 0 ? std::max(begin, i - mask.window + 1) : begin;
        const int64_t hi = mask.window > 0 ? std::min(end, i + mask.window) : end;
        set(kr + 4 * i, lo, i + 1, i + 1, i + 1);
        set(qr + 4 * i, i, hi, hi, hi);
      }
      continue;
    }
    // Block diffusion: noisy half [begin, mid), clean half [mid, end).
    const int64_t half = (end - begin) / 2;
    const int64_t mid = begin + half;
    segments.push_back(mid);
    segments.push_back(end);
    for (int64_t pos = 0; pos < half; ++pos) {
      const int64_t block_lo = pos / mask.block_size * mask.block_size;
      const int64_t block_hi = std::min(block_lo + mask.block_size, half);
      // Noisy query: its own noisy block, then the clean blocks before it.
      set(kr + 4 * (begin + pos), begin + block_lo, begin + block_hi, mid, mid + block_lo);
      // Clean query: the clean blocks up to and including its own.
      set(kr + 4 * (mid + pos), mid, mid + block_hi, mid + block_hi, mid + block_hi);
      // Noisy key: the noisy queries of its block only.
      set(qr + 4 * (begin + pos), begin + block_lo, begin + block_hi, begin + block_hi,
          begin + block_hi);
      // Clean key: noisy queries of later blocks, clean queries of this and later blocks.
      set(qr + 4 * (mid + pos), begin + block_hi, mid, mid + block_lo, end);
    }
  }
  return IntervalMask{at::tensor(segments, at::TensorOptions().dtype(at::kLong)), key_ranges,
                      query_ranges};
}

AttentionCpuForward attention_cpu_forward(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const IntervalMask& mask,
                                          double scale) {
  const at::ScalarType compute = ComputeType(q);
  const at::Tensor qc = q.to(compute).contiguous();
  const at::Tensor kc = k.to(compute).contiguous();
  const at::Tensor vc = v.to(compute).contiguous();
  const IntervalMask ranges{mask.segments, mask.key_ranges.contiguous(), mask.query_ranges};
  at::Tensor out = at::empty_like(qc);                               // (T, Hq, D)
  at::Tensor lse = at::empty({q.size(1), q.size(0)}, qc.options());  // (Hq, T)
  const std::vector<QueryTile> tiles =
      MakeQueryTiles(ToVector(mask.segments), ranges.key_ranges.const_data_ptr<int64_t>());
  const std::vector<WorkItem> items = MakeWorkItems(tiles, SingleTileRuns(tiles), q.size(1));
  // A tile in which no row sees a key gets no work item; its rows keep the
  // empty-row result.
  out.zero_();
  lse.fill_(-std::numeric_limits<double>::infinity());
  AT_DISPATCH_FLOATING_TYPES(compute, "attention_cpu_forward", [&] {
    const Problem<scalar_t> p = MakeProblem<scalar_t>(qc, kc, vc, ranges, scale);
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    scalar_t* lse_ptr = lse.mutable_data_ptr<scalar_t>();
    ParallelOverItems(static_cast<int64_t>(items.size()), [&](const auto& claim) {
      Workspace<scalar_t> ws(p.head_dim);
      for (int64_t i = claim(); i >= 0; i = claim()) {
        ForwardTile(p, tiles[items[i].tiles.begin], items[i].head, out_ptr, lse_ptr, ws);
      }
    });
  });
  return {out.to(q.scalar_type()), lse};
}

AttentionCpuGrads attention_cpu_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                         const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& out, const at::Tensor& lse,
                                         const IntervalMask& mask, double scale) {
  const at::ScalarType compute = ComputeType(q);
  const at::Tensor qc = q.to(compute).contiguous();
  const at::Tensor kc = k.to(compute).contiguous();
  const at::Tensor vc = v.to(compute).contiguous();
  const at::Tensor dout = grad_out.to(compute).contiguous();
  const at::Tensor lsec = lse.to(compute).contiguous();
  // Delta_i = dO_i . O_i, (Hq, T); the forward's O, so the identity
  // sum_j P_ij dP_ij = Delta_i holds for the P it produced.
  const at::Tensor delta = (dout * out.to(compute)).sum(-1).t().contiguous();
  const IntervalMask ranges{mask.segments, mask.key_ranges.contiguous(), mask.query_ranges};
  const int64_t num_heads = q.size(1);
  const int64_t num_kv_heads = k.size(1);
  const bool per_query_head = num_heads != num_kv_heads;
  // Keys no query sees, and queries that see no key, get gradient 0 without a tile.
  at::Tensor grad_q = at::zeros_like(qc);
  at::Tensor grad_k = per_query_head ? at::zeros_like(qc) : at::zeros_like(kc);
  at::Tensor grad_v = per_query_head ? at::zeros_like(qc) : at::zeros_like(vc);
  const std::vector<QueryTile> tiles =
      MakeQueryTiles(ToVector(mask.segments), ranges.key_ranges.const_data_ptr<int64_t>());
  const std::vector<WorkItem> items = MakeWorkItems(tiles, ClosedGroupRuns(tiles), num_heads);
  AT_DISPATCH_FLOATING_TYPES(compute, "attention_cpu_backward", [&] {
    const Problem<scalar_t> p = MakeProblem<scalar_t>(qc, kc, vc, ranges, scale);
    const Upstream<scalar_t> up{dout.const_data_ptr<scalar_t>(), lsec.const_data_ptr<scalar_t>(),
                                delta.const_data_ptr<scalar_t>()};
    const KeyValueGrads<scalar_t> kv{grad_k.mutable_data_ptr<scalar_t>(),
                                     grad_v.mutable_data_ptr<scalar_t>(), per_query_head};
    scalar_t* gq = grad_q.mutable_data_ptr<scalar_t>();
    ParallelOverItems(static_cast<int64_t>(items.size()), [&](const auto& claim) {
      Workspace<scalar_t> ws(p.head_dim);
      for (int64_t i = claim(); i >= 0; i = claim()) {
        for (int64_t t = items[i].tiles.begin; t < items[i].tiles.end; ++t) {
          GradTile(p, up, tiles[t], items[i].head, gq, kv, ws);
        }
      }
    });
  });
  if (per_query_head) {
    // (T, Hq, D) -> (T, Hkv, D): query head h belongs to kv head h / group.
    const int64_t tokens = q.size(0);
    const int64_t group = num_heads / num_kv_heads;
    grad_k = grad_k.view({tokens, num_kv_heads, group, q.size(2)}).sum(2);
    grad_v = grad_v.view({tokens, num_kv_heads, group, q.size(2)}).sum(2);
  }
  return {grad_q.to(q.scalar_type()), grad_k.to(k.scalar_type()), grad_v.to(v.scalar_type())};
}

}  // namespace ballast::kernels
