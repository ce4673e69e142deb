// What the kernel library's sources share: TensorFlow's headers and names, and a prefetch of
// rows gathered out of memory order. Included by layer_norm.cc, segment_sum.cc and
// gather_sum.cc; hvdtrack/model/kernels.py builds them into one library (and hashes this file
// with them into the cached library's name).

#ifndef HVDTRACK_MODEL_KERNELS_H_
#define HVDTRACK_MODEL_KERNELS_H_

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace hvdtrack {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::int64;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Requests every cache line of a row of width floats, for rows read out of memory order.
inline void Prefetch(const float* row, int64 width) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64 b = 0; b < width * static_cast<int64>(sizeof(float)); b += 64) {
    __builtin_prefetch(bytes + b);
  }
}

}  // namespace hvdtrack

#endif  // HVDTRACK_MODEL_KERNELS_H_
