// The first layer of the factorized edge update in one pass over the edges (CPU):
//
//   HvdtrackGatherSum(edge_a [E, W], edge_b [E, W], nodes_r [N, W], nodes_s [N, W],
//                     receivers int32 [E], senders int32 [E]; relu: bool)
//       -> (out [E, W], mask uint8 [E, ceil(W / 8) with relu, else 0])
//       row e = ((edge_a[e] + edge_b[e]) + nodes_r[receivers[e]]) + nodes_s[senders[e]],
//       then max(0, .) with relu; mask: bit c of row e set where out[e, c] > 0, what the
//       gradient (HvdtrackGatherSumGrad) needs instead of out
//
// In TensorFlow ops that is two gathers (each writing an [E, W] tensor), an AddN reading four
// [E, W] tensors and a Relu: eleven passes over [E, W] where this kernel makes five (four rows
// read, one written). The additions are in AddN's order ((a + b) + r) + s, so the result is
// bit for bit that of the ops, at any thread count (each row is computed whole by one thread;
// tests/model/test_gather_sum.py).
//
// Built with the other kernels into the one library by hvdtrack/model/kernels.py.

#include "kernels.h"

namespace hvdtrack {

// Shard's cost unit is about a CPU cycle: per output float, four loads (two gathered), three
// additions and a store.
constexpr int64 kCyclesPerFloat = 6;
// The gathered node rows lie anywhere in memory: each is requested this many edges ahead.
constexpr int64 kPrefetchRows = 8;

REGISTER_OP("HvdtrackGatherSum")
    .Input("edge_a: float")
    .Input("edge_b: float")
    .Input("nodes_r: float")
    .Input("nodes_s: float")
    .Input("receivers: int32")
    .Input("senders: int32")
    .Attr("relu: bool")
    .Output("out: float")
    .Output("mask: uint8")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle a, b, r, s, recv, send;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &a));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &b));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &r));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &s));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &recv));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 1, &send));
      DimensionHandle edges, width;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(a, 0), c->Dim(b, 0), &edges));
      TF_RETURN_IF_ERROR(c->Merge(edges, c->Dim(recv, 0), &edges));
      TF_RETURN_IF_ERROR(c->Merge(edges, c->Dim(send, 0), &edges));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(a, 1), c->Dim(b, 1), &width));
      TF_RETURN_IF_ERROR(c->Merge(width, c->Dim(r, 1), &width));
      TF_RETURN_IF_ERROR(c->Merge(width, c->Dim(s, 1), &width));
      c->set_output(0, c->Matrix(edges, width));
      bool relu;
      TF_RETURN_IF_ERROR(c->GetAttr("relu", &relu));
      DimensionHandle bytes = !relu                  ? c->MakeDim(0)
                              : c->ValueKnown(width) ? c->MakeDim(MaskBytes(c->Value(width)))
                                                     : c->UnknownDim();
      c->set_output(1, c->Matrix(edges, bytes));
      return Status();
    });

namespace {

// Every index in [0, rows); the message names the first that is not, and its edge.
Status CheckIndices(const char* what, const Tensor& indices, int64 rows) {
  const int32_t* ids = indices.flat<int32_t>().data();
  const int64 edges = indices.dim_size(0);  // (not called per edge in the loop's test)
  for (int64 e = 0; e < edges; ++e) {
    if (ids[e] < 0 || ids[e] >= rows) {
      return ::tensorflow::errors::InvalidArgument("HvdtrackGatherSum: ", what, "[", e,
                                                   "] = ", ids[e], " is out of range [0, ", rows,
                                                   "): edge ", e, " names no node");
    }
  }
  return Status();
}

}  // namespace

class GatherSumOp : public OpKernel {
 public:
  explicit GatherSumOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("relu", &relu_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& a = context->input(0);
    const Tensor& b = context->input(1);
    const Tensor& r = context->input(2);
    const Tensor& s = context->input(3);
    const Tensor& receivers = context->input(4);
    const Tensor& senders = context->input(5);
    const int64 edges = a.dim_size(0), width = a.dim_size(1);
    OP_REQUIRES(context,
                a.dims() == 2 && b.shape() == a.shape() && r.dims() == 2 && s.dims() == 2 &&
                    r.dim_size(1) == width && s.dim_size(1) == width,
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackGatherSum: edge_a and edge_b must be [edges, width] and nodes_r, "
                    "nodes_s [nodes, width], got shapes ",
                    a.shape().DebugString(), ", ", b.shape().DebugString(), ", ",
                    r.shape().DebugString(), ", ", s.shape().DebugString()));
    OP_REQUIRES(context,
                receivers.dims() == 1 && senders.dims() == 1 &&
                    receivers.dim_size(0) == edges && senders.dim_size(0) == edges,
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackGatherSum: receivers and senders must be [edges] = [", edges,
                    "], got shapes ", receivers.shape().DebugString(), " and ",
                    senders.shape().DebugString()));
    OP_REQUIRES_OK(context, CheckIndices("receivers", receivers, r.dim_size(0)));
    OP_REQUIRES_OK(context, CheckIndices("senders", senders, s.dim_size(0)));
    Tensor* out;
    // in edge_a's or edge_b's buffer when nothing else reads it (each row read, then written)
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0, 1}, 0, a.shape(), &out));
    const int64 bytes = relu_ ? MaskBytes(width) : 0;
    Tensor* mask;
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({edges, bytes}), &mask));
    if (edges == 0 || width == 0) return;
    uint8_t* bits = mask->flat<uint8_t>().data();
    const float* ap = a.flat<float>().data();
    const float* bp = b.flat<float>().data();
    const float* rp = r.flat<float>().data();
    const float* sp = s.flat<float>().data();
    const int32_t* recv = receivers.flat<int32_t>().data();
    const int32_t* send = senders.flat<int32_t>().data();
    float* op = out->flat<float>().data();
    const bool relu = relu_;
    auto* workers = context->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, edges, width * kCyclesPerFloat,
        [&](int64 begin, int64 end) {
          for (int64 e = begin; e < end; ++e) {
            if (e + kPrefetchRows < end) {
              Prefetch(rp + recv[e + kPrefetchRows] * width, width);
              Prefetch(sp + send[e + kPrefetchRows] * width, width);
            }
            const float* ar = ap + e * width;
            const float* br = bp + e * width;
            const float* rr = rp + recv[e] * width;
            const float* sr = sp + send[e] * width;
            float* o = op + e * width;
            if (relu) {
#pragma omp simd
              for (int64 c = 0; c < width; ++c) {
                o[c] = std::max(((ar[c] + br[c]) + rr[c]) + sr[c], 0.f);
              }
              MaskRow(o, width, bits + e * bytes);
            } else {
#pragma omp simd
              for (int64 c = 0; c < width; ++c) o[c] = ((ar[c] + br[c]) + rr[c]) + sr[c];
            }
          }
        });
  }

 private:
  bool relu_;
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackGatherSum").Device(::tensorflow::DEVICE_CPU), GatherSumOp);

}  // namespace hvdtrack
