// Argument checks shared by every host launcher. Each throws tessera::Error naming the operator,
// the argument, what was expected and what was got. None touches the GPU, so all of them can be
// tested on a machine without one.
#pragma once

#include <initializer_list>
#include <string>

#include "runtime/check.hpp"
#include "tessera/tensor.hpp"

namespace tessera::detail {

// A CUDA tensor with a sane shape and a non-null pointer (unless it has no elements).
void check_cuda_tensor(const char* op, const char* arg, const TensorView& t);
void check_dtype_in(const char* op, const char* arg, const TensorView& t,
                    std::initializer_list<DType> allowed);
void check_same_dtype(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                      const TensorView& ref);
void check_same_device(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                       const TensorView& ref);
void check_same_shape(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                      const TensorView& ref);
// `t` a CUDA tensor on ref's device with ref's dtype and shape (an output or a second input that
// must match `ref_arg`).
void check_like(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                const TensorView& ref);
// An output must not write one element twice (no stride-0 dimension of size > 1).
void check_no_internal_overlap(const char* op, const char* arg, const TensorView& t);
// `out` must not share memory with `in`, except being exactly the same view when
// `allow_identical` (in-place elementwise use).
void check_no_overlap(const char* op, const char* out_arg, const TensorView& out,
                      const char* in_arg, const TensorView& in, bool allow_identical);
// `t` viewed with `shape` by torch's broadcasting rules (stride 0 on broadcast dimensions).
TensorView broadcast_to(const char* op, const char* arg, const TensorView& t, const TensorView& shape_of);

// Shape of a and b broadcast together, written into `out_shape`; returns its ndim.
int broadcast_shapes(const char* op, const char* a_arg, const TensorView& a, const char* b_arg,
                     const TensorView& b, int64_t* out_shape);

bool same_view(const TensorView& x, const TensorView& y);

// "2-d [8, 100]": how errors say what a tensor argument was.
std::string dims(const TensorView& t);

}  // namespace tessera::detail
