// CPU implementation of kernels/gated_delta_rule.h: the forward and backward
// passes that the autograd wrapper in kernels/gated_delta_rule.cc calls.
// gated_delta_rule() validates the arguments; nothing here checks them again.
// The CUDA kernel (kernels/cuda/gated_delta_rule_cuda.h) has the same
// contract and returns the same structs.
//
//   q, k (T, Hk, Dk) and v (T, Hv, Dv): fp32 or bf16, unit stride in the head
//   dim, any token and head strides. g, beta (T, Hv): fp32 or bf16.
//   cu_seqlens int64 (N + 1). initial_state (N, Hv, Dk, Dv) fp32 or undefined.
#ifndef BALLAST_KERNELS_CPU_GATED_DELTA_RULE_CPU_H_
#define BALLAST_KERNELS_CPU_GATED_DELTA_RULE_CPU_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ballast::kernels {

// Tokens per chunk of the WY form.
inline constexpr int64_t kGdrChunk = 64;

// A chunk: kGdrChunk tokens of one document, or fewer at its end.
struct GdrChunk {
  int64_t begin;   // first token
  int64_t length;  // 1..kGdrChunk
};

// The chunks of a packed row, document after document in token order: the
// order of chunk_states' rows. Document n's chunks are [first[n],
// first[n + 1]); an empty document has none.
struct GdrChunkTable {
  std::vector<GdrChunk> chunks;
  std::vector<int64_t> first;  // (N + 1)
};
GdrChunkTable gdr_chunk_table(const at::Tensor& cu_seqlens);

struct GdrForward {
  at::Tensor out;           // (T, Hv, Dv) v's dtype
  at::Tensor final_state;   // (N, Hv, Dk, Dv) fp32
  at::Tensor chunk_states;  // (chunks, Hv, Dk, Dv) fp32: the state each chunk starts from
};

GdrForward gated_delta_rule_cpu_forward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& g,
                                        const at::Tensor& beta, const at::Tensor& cu_seqlens,
                                        const at::Tensor& initial_state, double scale,
                                        double l2norm_eps);

struct GdrGrads {
  at::Tensor d_q, d_k, d_v;  // the inputs' sizes (contiguous) and dtypes
  at::Tensor d_g, d_beta;    // (T, Hv), g's and beta's dtypes
  at::Tensor d_state;        // (N, Hv, Dk, Dv) fp32: the gradient of initial_state
};

// chunk_states from the forward; d_out (T, Hv, Dv) any float dtype or
// undefined (zero); d_final (N, Hv, Dk, Dv) or undefined (zero).
GdrGrads gated_delta_rule_cpu_backward(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& g,
                                       const at::Tensor& beta, const at::Tensor& cu_seqlens,
                                       const at::Tensor& chunk_states, const at::Tensor& d_out,
                                       const at::Tensor& d_final, double scale, double l2norm_eps);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_GATED_DELTA_RULE_CPU_H_
