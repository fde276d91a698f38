#include "ops/attention/attention_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "bench/host.hpp"
#include "runtime/check.hpp"

namespace tessera::reference {
namespace {

constexpr const char* kOp = "reference.attention";
constexpr double kInf = std::numeric_limits<double>::infinity();

// One side's rows in double: [rows, heads, dim], row-major (a padded batch is batch * seq rows).
struct Rows {
  std::vector<double> data;
  int64_t rows = 0, heads = 0, dim = 0;
  const double* at(int64_t row, int64_t h) const { return &data[static_cast<size_t>((row * heads + h) * dim)]; }
};

Rows load(const TensorView& t, int lead) {
  Rows r;
  r.rows = 1;
  for (int i = 0; i < lead; ++i) r.rows *= t.shape[i];
  r.heads = t.shape[lead];
  r.dim = t.shape[lead + 1];
  r.data = host::tabulate(t.numel(), [&](int64_t i) { return host::load_double(t, i); });
  return r;
}

std::string dims_of(const TensorView& t) { return std::to_string(t.ndim) + "-d"; }

// The problem as the loops see it: rows, sequence offsets and the mask.
struct Problem {
  Rows q, k, v;
  std::vector<int64_t> cu_q, cu_k;
  AttentionSpec spec;
  int64_t group = 1;  // query heads per key/value head
  bool padded = true;

  int64_t batch() const { return static_cast<int64_t>(cu_q.size()) - 1; }
  // Whether query i of a sequence (len_q queries, len_k keys) sees key j.
  bool sees(int64_t i, int64_t j, int64_t len_q, int64_t len_k) const {
    const int64_t c = i + len_k - len_q;
    if (spec.causal && j > c) return false;
    if (spec.window_right >= 0 && j > c + spec.window_right) return false;
    return spec.window_left < 0 || j >= c - spec.window_left;
  }
  // ALiBi's bias of query i against key j of sequence b (head h): 0 without slopes.
  double bias(int64_t b, int64_t h, int64_t i, int64_t j, int64_t len_q, int64_t len_k) const {
    if (spec.alibi_slopes.empty()) return 0;
    const bool per_head = spec.alibi_slopes.size() == static_cast<size_t>(q.heads);
    const double slope = spec.alibi_slopes[static_cast<size_t>(per_head ? h : b * q.heads + h)];
    return -slope * std::abs(static_cast<double>(i + len_k - len_q - j));
  }
  // The score of query row qi (head h) against key row kj (ALiBi's bias aside, which has no
  // gradient), and d(score)/d(scale * q.k).
  double score(int64_t qi, int64_t kj, int64_t h, double* slope = nullptr) const {
    const double* a = q.at(qi, h);
    const double* b = k.at(kj, h / group);
    double dot = 0;
    for (int64_t d = 0; d < q.dim; ++d) dot += a[d] * b[d];
    const double u = spec.scale * dot;
    if (spec.softcap <= 0) {
      if (slope) *slope = 1;
      return u;
    }
    const double t = std::tanh(u / spec.softcap);
    if (slope) *slope = 1 - t * t;
    return spec.softcap * t;
  }
  int64_t lse_index(int64_t b, int64_t h, int64_t row) const {
    const int64_t len = cu_q[b + 1] - cu_q[b];
    return padded ? (b * q.heads + h) * len + (row - cu_q[b]) : h * q.rows + row;
  }
};

void check_cu(const std::vector<int64_t>& cu, const char* arg, int64_t total) {
  if (cu.size() < 2 || cu.front() != 0 || cu.back() != total)
    detail::throw_arg(ErrorKind::value, kOp, arg, "batch + 1 offsets from 0 to " + std::to_string(total),
                      std::to_string(cu.size()) + " offsets");
  for (size_t i = 1; i < cu.size(); ++i)
    if (cu[i] < cu[i - 1])
      detail::throw_arg(ErrorKind::value, kOp, arg, "non-decreasing offsets",
                        std::to_string(cu[i - 1]) + " then " + std::to_string(cu[i]));
}

Problem make(const TensorView& q, const TensorView& k, const TensorView& v, const std::vector<int64_t>* cu_q,
             const std::vector<int64_t>* cu_k, const AttentionSpec& spec) {
  const int rank = cu_q ? 3 : 4;
  for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{"q", &q}, {"k", &k}, {"v", &v}})
    if (t->ndim != rank)
      detail::throw_arg(ErrorKind::value, kOp, arg, std::to_string(rank) + "-d", dims_of(*t));
  const int lead = rank - 2;  // dimensions before heads
  if (k.shape[lead - 1] != v.shape[lead - 1] || (!cu_q && (q.shape[0] != k.shape[0] || k.shape[0] != v.shape[0])))
    detail::throw_arg(ErrorKind::value, kOp, "v", "the batch and keys of k", "other sizes");
  if (k.shape[lead] != v.shape[lead] || k.shape[lead] == 0 || q.shape[lead] % k.shape[lead] != 0)
    detail::throw_arg(ErrorKind::value, kOp, "k", "heads dividing q's " + std::to_string(q.shape[lead]),
                      std::to_string(k.shape[lead]));
  if (q.shape[lead + 1] != k.shape[lead + 1])
    detail::throw_arg(ErrorKind::value, kOp, "k", "q's head_dim " + std::to_string(q.shape[lead + 1]),
                      std::to_string(k.shape[lead + 1]));
  Problem p;
  p.q = load(q, lead);
  p.k = load(k, lead);
  p.v = load(v, lead);
  p.group = p.q.heads / p.k.heads;
  p.spec = spec;
  if (p.spec.scale == 0) p.spec.scale = 1 / std::sqrt(static_cast<double>(p.q.dim));
  p.padded = cu_q == nullptr;
  const int64_t batch = cu_q ? static_cast<int64_t>(cu_q->size()) - 1 : q.shape[0];
  const size_t slopes = p.spec.alibi_slopes.size();
  if (slopes != 0 && slopes != static_cast<size_t>(p.q.heads) && slopes != static_cast<size_t>(batch * p.q.heads))
    detail::throw_arg(ErrorKind::value, kOp, "alibi_slopes",
                      "heads_q = " + std::to_string(p.q.heads) + " or batch * heads_q = " +
                          std::to_string(batch * p.q.heads) + " slopes",
                      std::to_string(slopes));
  if (cu_q) {
    check_cu(*cu_q, "cu_seqlens_q", p.q.rows);
    check_cu(*cu_k, "cu_seqlens_k", p.k.rows);
    if (cu_q->size() != cu_k->size())
      detail::throw_arg(ErrorKind::value, kOp, "cu_seqlens_k", std::to_string(cu_q->size()) + " offsets",
                        std::to_string(cu_k->size()));
    p.cu_q = *cu_q;
    p.cu_k = *cu_k;
  } else {
    for (int64_t b = 0; b <= q.shape[0]; ++b) {
      p.cu_q.push_back(b * q.shape[1]);
      p.cu_k.push_back(b * k.shape[1]);
    }
  }
  // A window side at or beyond the longest key sequence is unbounded (FlashAttention's reading,
  // against its seqlen_k or max_seqlen_k).
  int64_t longest = 0;
  for (size_t b = 1; b < p.cu_k.size(); ++b) longest = std::max(longest, p.cu_k[b] - p.cu_k[b - 1]);
  if (p.spec.window_left >= longest) p.spec.window_left = -1;
  if (p.spec.window_right >= longest) p.spec.window_right = -1;
  return p;
}

// Softmax row of query row `row` (head h, sequence b): probabilities of keys [k0, k0 + len_k)
// into `prob` (0 where masked) and the log-sum-exp (+inf where no key is seen).
double softmax_row(const Problem& p, int64_t b, int64_t h, int64_t row, std::vector<double>& prob) {
  const int64_t q0 = p.cu_q[b], k0 = p.cu_k[b];
  const int64_t len_q = p.cu_q[b + 1] - q0, len_k = p.cu_k[b + 1] - k0;
  prob.assign(static_cast<size_t>(len_k), 0.0);
  double m = -kInf;
  for (int64_t j = 0; j < len_k; ++j)
    if (p.sees(row - q0, j, len_q, len_k)) {
      prob[j] = p.score(row, k0 + j, h) + p.bias(b, h, row - q0, j, len_q, len_k);
      m = std::max(m, prob[j]);
    }
  if (m == -kInf) return kInf;
  double sum = 0;
  for (int64_t j = 0; j < len_k; ++j)
    if (p.sees(row - q0, j, len_q, len_k)) sum += prob[j] = std::exp(prob[j] - m);
  for (double& x : prob) x /= sum;
  return m + std::log(sum);
}

AttentionOutput forward(const Problem& p) {
  AttentionOutput r;
  const int64_t dv = p.v.dim;
  r.out.assign(static_cast<size_t>(p.q.rows * p.q.heads * dv), 0.0);
  r.lse.assign(static_cast<size_t>(p.q.rows * p.q.heads), 0.0);
  host::parallel_for(p.batch() * p.q.heads, [&](int64_t lo, int64_t hi) {
    std::vector<double> prob;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / p.q.heads, h = bh % p.q.heads;
      for (int64_t row = p.cu_q[b]; row < p.cu_q[b + 1]; ++row) {
        r.lse[p.lse_index(b, h, row)] = softmax_row(p, b, h, row, prob);
        double* o = &r.out[static_cast<size_t>((row * p.q.heads + h) * dv)];
        for (size_t j = 0; j < prob.size(); ++j)
          if (prob[j] != 0)
            for (int64_t d = 0; d < dv; ++d) o[d] += prob[j] * p.v.at(p.cu_k[b] + j, h / p.group)[d];
      }
    }
  });
  return r;
}

// dS = P * (dP - rowsum(dO * O)), dP = dO V^T; dq, dk through the softcap's slope and the scale;
// dv = P^T dO. Parallel over (sequence, key/value head): each owns its dk and dv rows.
AttentionGrads backward(const Problem& p, const Rows& dout) {
  AttentionGrads g;
  const int64_t dv = p.v.dim, dim = p.q.dim;
  g.dq.assign(p.q.data.size(), 0.0);
  g.dk.assign(p.k.data.size(), 0.0);
  g.dv.assign(p.v.data.size(), 0.0);
  host::parallel_for(p.batch() * p.k.heads, [&](int64_t lo, int64_t hi) {
    std::vector<double> prob, dp;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / p.k.heads, hk = bh % p.k.heads, k0 = p.cu_k[b];
      for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h)
        for (int64_t row = p.cu_q[b]; row < p.cu_q[b + 1]; ++row) {
          softmax_row(p, b, h, row, prob);
          const double* go = dout.at(row, h);
          dp.assign(prob.size(), 0.0);
          double delta = 0;  // rowsum(dO * O) = sum_j P_j (dO . v_j)
          for (size_t j = 0; j < prob.size(); ++j) {
            if (prob[j] == 0) continue;
            const double* vj = p.v.at(k0 + j, hk);
            for (int64_t d = 0; d < dv; ++d) dp[j] += go[d] * vj[d];
            delta += prob[j] * dp[j];
          }
          double* gq = &g.dq[static_cast<size_t>((row * p.q.heads + h) * dim)];
          for (size_t j = 0; j < prob.size(); ++j) {
            if (prob[j] == 0) continue;
            double slope = 1;
            p.score(row, k0 + j, h, &slope);
            const double du = prob[j] * (dp[j] - delta) * slope * p.spec.scale;
            const double* kj = p.k.at(k0 + j, hk);
            const double* qi = p.q.at(row, h);
            double* gk = &g.dk[static_cast<size_t>(((k0 + j) * p.k.heads + hk) * dim)];
            double* gv = &g.dv[static_cast<size_t>(((k0 + j) * p.v.heads + hk) * dv)];
            for (int64_t d = 0; d < dim; ++d) {
              gq[d] += du * kj[d];
              gk[d] += du * qi[d];
            }
            for (int64_t d = 0; d < dv; ++d) gv[d] += prob[j] * go[d];
          }
        }
    }
  });
  return g;
}

Rows load_grad(const TensorView& grad_out, const Problem& p, int lead) {
  if (grad_out.ndim != lead + 2 || grad_out.numel() != p.q.rows * p.q.heads * p.v.dim)
    detail::throw_arg(ErrorKind::value, kOp, "grad_out", "the output's shape", dims_of(grad_out));
  return load(grad_out, lead);
}

}  // namespace

AttentionOutput attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const AttentionSpec& spec) {
  return forward(make(q, k, v, nullptr, nullptr, spec));
}

AttentionGrads attention_backward(const TensorView& grad_out, const TensorView& q, const TensorView& k,
                                  const TensorView& v, const AttentionSpec& spec) {
  const Problem p = make(q, k, v, nullptr, nullptr, spec);
  return backward(p, load_grad(grad_out, p, 2));
}

AttentionOutput attention_varlen_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                         const std::vector<int64_t>& cu_seqlens_q,
                                         const std::vector<int64_t>& cu_seqlens_k,
                                         const AttentionSpec& spec) {
  return forward(make(q, k, v, &cu_seqlens_q, &cu_seqlens_k, spec));
}

AttentionGrads attention_varlen_backward(const TensorView& grad_out, const TensorView& q,
                                         const TensorView& k, const TensorView& v,
                                         const std::vector<int64_t>& cu_seqlens_q,
                                         const std::vector<int64_t>& cu_seqlens_k,
                                         const AttentionSpec& spec) {
  const Problem p = make(q, k, v, &cu_seqlens_q, &cu_seqlens_k, spec);
  return backward(p, load_grad(grad_out, p, 1));
}

}  // namespace tessera::reference
