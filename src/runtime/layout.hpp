// Host-side layout helpers: views of tensor views, and the indexers that strided kernels use.
#pragma once

#include <array>
#include <utility>

#include "tessera/tensor.hpp"
#include "tile/indexing.cuh"

namespace tessera::runtime {

// t with dimensions d0 and d1 swapped (negative: from the end), a view as torch's transpose; by
// default the last two: a matrix as the other operand order of a product sees it.
inline TensorView transposed(const TensorView& t, int d0 = -2, int d1 = -1) {
  TensorView v = t;
  d0 += d0 < 0 ? t.ndim : 0, d1 += d1 < 0 ? t.ndim : 0;
  std::swap(v.shape[d0], v.shape[d1]);
  std::swap(v.strides[d0], v.strides[d1]);
  return v;
}

// Indexer over views that share one shape. Size-1 dimensions are dropped and neighbours that are
// contiguous in every view are merged, so kernels do as few divisions per element as the layout
// allows.
template <int NT>
tile::StridedIndexer<NT> make_indexer(const std::array<const TensorView*, NT>& views) {
  tile::StridedIndexer<NT> idx{};
  const TensorView& ref = *views[0];
  int nd = 0;
  for (int d = 0; d < ref.ndim; ++d) {
    if (ref.shape[d] == 1) continue;
    bool merge = nd > 0;
    for (int t = 0; t < NT && merge; ++t)
      merge = idx.strides[t][nd - 1] == views[t]->strides[d] * ref.shape[d];
    if (merge) {
      idx.shape[nd - 1] *= ref.shape[d];
      for (int t = 0; t < NT; ++t) idx.strides[t][nd - 1] = views[t]->strides[d];
    } else {
      idx.shape[nd] = ref.shape[d];
      for (int t = 0; t < NT; ++t) idx.strides[t][nd] = views[t]->strides[d];
      ++nd;
    }
  }
  if (nd == 0) {  // a single element
    idx.shape[0] = 1;
    nd = 1;
  }
  idx.ndim = nd;
  return idx;
}

}  // namespace tessera::runtime
