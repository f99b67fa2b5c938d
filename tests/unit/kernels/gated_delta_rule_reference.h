// Float64 references for kernels/gated_delta_rule.h and kernels/causal_conv1d.h,
// as plain as the math: one token at a time, per document, the state starting
// from the document's initial state. Shared by the CPU tests and the tests of
// the op-by-op path.
#ifndef BALLAST_TESTS_UNIT_KERNELS_GATED_DELTA_RULE_REFERENCE_H_
#define BALLAST_TESTS_UNIT_KERNELS_GATED_DELTA_RULE_REFERENCE_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace ballast::kernels::gdr_reference {

constexpr double kL2Eps = 1e-6;

struct Inputs {
  at::Tensor q, k, v, g, beta;  // (T, Hk, Dk), (T, Hk, Dk), (T, Hv, Dv), (T, Hv), (T, Hv)
  at::Tensor cu_seqlens;        // int64 (N + 1)
  at::Tensor initial_state;     // (N, Hv, Dk, Dv) or undefined
  double scale = 1.0;
};

inline at::Tensor CuSeqlens(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu{0};
  for (int64_t l : lengths) cu.push_back(cu.back() + l);
  return torch::tensor(cu, torch::kLong);
}

// Random inputs in the ranges Qwen3.5 produces: g = -exp(A_log) softplus(a +
// dt_bias) is at most 0 and mostly within [-2, 0]; beta is a sigmoid.
inline Inputs RandomInputs(const std::vector<int64_t>& lengths, int64_t hk, int64_t hv, int64_t dk,
                           int64_t dv, bool with_state, at::ScalarType dtype = torch::kFloat) {
  int64_t tokens = 0;
  for (int64_t l : lengths) tokens += l;
  Inputs in;
  in.q = torch::randn({tokens, hk, dk}).to(dtype);
  in.k = torch::randn({tokens, hk, dk}).to(dtype);
  in.v = torch::randn({tokens, hv, dv}).to(dtype);
  in.g = -torch::softplus(torch::randn({tokens, hv}) - 1.0) * torch::rand({hv}) * 2;
  in.beta = torch::sigmoid(torch::randn({tokens, hv}));
  in.cu_seqlens = CuSeqlens(lengths);
  if (with_state) {
    in.initial_state = torch::randn({static_cast<int64_t>(lengths.size()), hv, dk, dv}) * 0.5;
  }
  in.scale = 1.0 / std::sqrt(static_cast<double>(dk));
  return in;
}

// Document n of a packed row, tokens [begin, begin + length), as a row of
// its own with its initial state.
inline Inputs DocumentAlone(const Inputs& packed, int64_t n, int64_t begin, int64_t length) {
  Inputs alone = packed;
  alone.q = packed.q.narrow(0, begin, length);
  alone.k = packed.k.narrow(0, begin, length);
  alone.v = packed.v.narrow(0, begin, length);
  alone.g = packed.g.narrow(0, begin, length);
  alone.beta = packed.beta.narrow(0, begin, length);
  alone.cu_seqlens = CuSeqlens({length});
  if (packed.initial_state.defined()) alone.initial_state = packed.initial_state.narrow(0, n, 1);
  return alone;
}

// q, k (T, Hk, Dk) and v (T, Hv, Dv) as views of one random (T, 2 Hk Dk +
// Hv Dv) projection, as the model slices in_proj_qkv's output.
struct FusedQkv {
  at::Tensor fused, q, k, v;
};
inline FusedQkv FusedProjection(int64_t tokens, int64_t hk, int64_t hv, int64_t dk, int64_t dv) {
  FusedQkv f;
  f.fused = torch::randn({tokens, 2 * hk * dk + hv * dv});
  f.q = f.fused.narrow(1, 0, hk * dk).view({tokens, hk, dk});
  f.k = f.fused.narrow(1, hk * dk, hk * dk).view({tokens, hk, dk});
  f.v = f.fused.narrow(1, 2 * hk * dk, hv * dv).view({tokens, hv, dv});
  return f;
}

struct Output {
  at::Tensor out;          // (T, Hv, Dv) float64
  at::Tensor final_state;  // (N, Hv, Dk, Dv) float64
};

// The recurrence in float64 scalars, for long inputs (forward only):
//   S <- exp(g_t) S;  u = beta_t (v_t - S^T k_t);  S <- S + k_t u^T;  o_t = S^T q_t
inline Output Forward(const Inputs& in) {
  const at::Tensor q = in.q.to(torch::kDouble).contiguous();
  const at::Tensor k = in.k.to(torch::kDouble).contiguous();
  const at::Tensor v = in.v.to(torch::kDouble).contiguous();
  const at::Tensor g = in.g.to(torch::kDouble).contiguous();
  const at::Tensor beta = in.beta.to(torch::kDouble).contiguous();
  const int64_t tokens = q.size(0), hk = q.size(1), dk = q.size(2), hv = v.size(1), dv = v.size(2);
  const int64_t docs = in.cu_seqlens.numel() - 1;
  const int64_t* cu = in.cu_seqlens.data_ptr<int64_t>();
  Output result{torch::zeros({tokens, hv, dv}, torch::kDouble),
                torch::zeros({docs, hv, dk, dv}, torch::kDouble)};
  if (in.initial_state.defined()) result.final_state.copy_(in.initial_state);
  const double* qp = q.data_ptr<double>();
  const double* kp = k.data_ptr<double>();
  const double* vp = v.data_ptr<double>();
  const double* gp = g.data_ptr<double>();
  const double* bp = beta.data_ptr<double>();
  double* op = result.out.data_ptr<double>();
  std::vector<double> qn(dk), kn(dk), u(dv);
  for (int64_t n = 0; n < docs; ++n) {
    for (int64_t h = 0; h < hv; ++h) {
      double* s = result.final_state.data_ptr<double>() + (n * hv + h) * dk * dv;
      const int64_t key_head = h / (hv / hk);
      for (int64_t t = cu[n]; t < cu[n + 1]; ++t) {
        double qq = 0, kk = 0;
        for (int64_t i = 0; i < dk; ++i) {
          qq += qp[(t * hk + key_head) * dk + i] * qp[(t * hk + key_head) * dk + i];
          kk += kp[(t * hk + key_head) * dk + i] * kp[(t * hk + key_head) * dk + i];
        }
        for (int64_t i = 0; i < dk; ++i) {
          qn[i] = qp[(t * hk + key_head) * dk + i] / std::sqrt(qq + kL2Eps) * in.scale;
          kn[i] = kp[(t * hk + key_head) * dk + i] / std::sqrt(kk + kL2Eps);
        }
        const double decay = std::exp(gp[t * hv + h]), b = bp[t * hv + h];
        for (int64_t i = 0; i < dk * dv; ++i) s[i] *= decay;
        for (int64_t j = 0; j < dv; ++j) {
          double predicted = 0;
          for (int64_t i = 0; i < dk; ++i) predicted += s[i * dv + j] * kn[i];
          u[j] = b * (vp[(t * hv + h) * dv + j] - predicted);
        }
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) s[i * dv + j] += kn[i] * u[j];
        for (int64_t j = 0; j < dv; ++j) {
          double o = 0;
          for (int64_t i = 0; i < dk; ++i) o += s[i * dv + j] * qn[i];
          op[(t * hv + h) * dv + j] = o;
        }
      }
    }
  }
  return result;
}

// The same recurrence in float64 ATen ops, all heads at once, so that autograd
// gives the reference gradients. Inputs are used as given (float64 leaves).
inline Output ForwardAutograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& g, const at::Tensor& beta,
                              const at::Tensor& cu_seqlens, const at::Tensor& initial_state,
                              double scale) {
  const int64_t hk = q.size(1), dk = q.size(2), hv = v.size(1), dv = v.size(2);
  const at::Tensor qn =
      (q / torch::sqrt(q.pow(2).sum(-1, true) + kL2Eps) * scale).repeat_interleave(hv / hk, 1);
  const at::Tensor kn =
      (k / torch::sqrt(k.pow(2).sum(-1, true) + kL2Eps)).repeat_interleave(hv / hk, 1);
  const int64_t docs = cu_seqlens.numel() - 1;
  const int64_t* cu = cu_seqlens.data_ptr<int64_t>();
  std::vector<at::Tensor> outs, finals;
  for (int64_t n = 0; n < docs; ++n) {
    at::Tensor s =
        initial_state.defined() ? initial_state[n] : torch::zeros({hv, dk, dv}, v.options());
    for (int64_t t = cu[n]; t < cu[n + 1]; ++t) {
      s = s * torch::exp(g[t]).view({hv, 1, 1});
      const at::Tensor u =
          beta[t].unsqueeze(-1) * (v[t] - (s * kn[t].unsqueeze(-1)).sum(1));  // (Hv, Dv)
      s = s + kn[t].unsqueeze(-1) * u.unsqueeze(1);
      outs.push_back((s * qn[t].unsqueeze(-1)).sum(1));
    }
    finals.push_back(s);
  }
  return {outs.empty() ? torch::zeros({0, hv, dv}, v.options()) : torch::stack(outs),
          torch::stack(finals)};
}

// y[t] = silu(sum_j w[:, j] x[t - (K - 1) + j]) per document, x before the
// document's start read from its window (zeros without one). Float64 ATen ops.
inline at::Tensor ConvForward(const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& cu_seqlens, const at::Tensor& initial_window) {
  const int64_t channels = x.size(1), taps = weight.size(1);
  const int64_t docs = cu_seqlens.numel() - 1;
  const int64_t* cu = cu_seqlens.data_ptr<int64_t>();
  std::vector<at::Tensor> outs;
  for (int64_t n = 0; n < docs; ++n) {
    const int64_t length = cu[n + 1] - cu[n];
    const at::Tensor before = initial_window.defined()
                                  ? initial_window[n].t()
                                  : torch::zeros({taps - 1, channels}, x.options());
    const at::Tensor padded = torch::cat({before, x.narrow(0, cu[n], length)});
    at::Tensor acc = torch::zeros({length, channels}, x.options());
    for (int64_t j = 0; j < taps; ++j)
      acc = acc + padded.narrow(0, j, length) * weight.select(1, j);
    outs.push_back(torch::silu(acc));
  }
  return torch::cat(outs);
}

// |got - want| / |want| in the Frobenius norm, in float64.
inline double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  const double norm = want.to(torch::kDouble).norm().item<double>();
  const double diff = (got.to(torch::kDouble) - want.to(torch::kDouble)).norm().item<double>();
  return norm == 0 ? diff : diff / norm;
}

}  // namespace ballast::kernels::gdr_reference

#endif  // BALLAST_TESTS_UNIT_KERNELS_GATED_DELTA_RULE_REFERENCE_H_
