// Sum of the rows of a float32 [E, W] tensor per segment id (CPU): the node update's sum of the
// edge latents each node receives or sends.
//
//   HvdtrackSegmentSum(values [E, W], segment_ids int32 [E], num_segments int32 N) -> [N, W]
//       row n = sum of values[e] over the edges e with segment_ids[e] == n (zeros if none)
//
// TensorFlow's CPU UnsortedSegmentSum splits the N output rows among its threads, and every
// thread scans all E ids and reads the value rows of its own: two threads take longer than one.
// Here each of TensorFlow's intra-op threads takes one range of output rows holding about E /
// threads of the ids (counted once, serially); it scans all E ids in order and adds the value
// rows of its own edges, requested ahead, onto zeros: each row gets its edges in ascending edge
// order. With one thread (or under 2 x kBlockSegments rows) the edges are added in order
// straight into their rows, as TensorFlow's kernel does, which gives every row the same
// additions in the same order. So the result is the same at any thread count and bit-identical
// to TensorFlow's one-thread kernel (tests/model/test_segment_sum.py). An earlier version
// counting-sorted the ids into CSR offsets and read each row's edges out of memory order: at
// 400,000 edges on two threads it took about a fifth more time (docs/performance.md,
// 2026-12-01).
//
//   HvdtrackSegmentAdd(sums [N, W], values [E, W], segment_ids int32 [E]) -> [N, W]
//       sums with the same edges' rows added (sums + HvdtrackSegmentSum(values, ...)), in
//       place when TensorFlow can hand over sums' buffer: the backward pass of model.recompute
//       adds each chunk of edges into one [N, W] accumulator without a second [N, W] tensor for
//       the chunk's sums and a third for their addition. Each row gets its edges added in
//       ascending edge order onto its old value, at any thread count, as above.
//
//   HvdtrackGatherSumGrad(upstream [E, W], mask uint8 [E, ceil(W / 8) or 0], receivers int32 [E],
//                         senders int32 [E], num_nodes int32 N, receiver_sums_in [N or 0, W],
//                         sender_sums_in [N or 0, W]; relu: bool)
//       -> (edges [E, W], receiver_sums [N, W], sender_sums [N, W])
//       HvdtrackGatherSum's gradient from its mask (not its output, which the backward pass
//       then need not keep): edges = upstream * (bit set) with relu (TensorFlow's ReluGrad on
//       the output), else upstream, in upstream's buffer when TensorFlow can hand it over, and
//       its HvdtrackSegmentSum per receiver and per sender, added onto the *_sums_in given
//       ([N, W]: as HvdtrackSegmentAdd, in their buffers when handed over; the backward pass
//       of model.recompute adds chunk after chunk of edges into one pair) or onto zeros
//       ([0, W]). With one thread it is one pass over the edges (ReluGrad and the two sums
//       were three, each reading [E, W] again); with more, the mask runs in blocks of edges on
//       the threads, then the sums: on two threads one per thread, in edge order; on more as
//       above. The sums are those of HvdtrackSegmentSum (HvdtrackSegmentAdd) bit for bit.
//
// Built with the other kernels into the one library by hvdtrack/model/kernels.py.

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "kernels.h"

namespace hvdtrack {

// Segments per thread at least, on average (ranges are cut by edges, so one may hold fewer):
// 256 rows of 64 floats (64 KiB of output, about 2,000 edges at the model's 8 per node)
// amortise the scheduling and the scan of all ids. Only the split of the work depends on it,
// never a value.
constexpr int64 kBlockSegments = 256;
// Shard's cost unit is about a CPU cycle: one float loaded, added and stored per edge column,
// rounded up because the sums' rows are written out of memory order (and a range's edge rows
// read with gaps).
constexpr int64 kCyclesPerFloat = 4;
// An edge's segment rows lie anywhere in the sums, and a range's edges anywhere in values: each
// is requested this many edges ahead, so that the loads overlap (measured on the gradient
// kernel's one-thread pass at 160,000 edges: 62 ms a step instead of 116).
constexpr int64 kPrefetchRows = 8;

REGISTER_OP("HvdtrackSegmentSum")
    .Input("values: float")
    .Input("segment_ids: int32")
    .Input("num_segments: int32")
    .Output("sums: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle values, ids, scalar;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &ids));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &scalar));
      DimensionHandle edges, segments;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(values, 0), c->Dim(ids, 0), &edges));
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &segments));
      c->set_output(0, c->Matrix(segments, c->Dim(values, 1)));
      return Status();
    });

REGISTER_OP("HvdtrackSegmentAdd")
    .Input("sums: float")
    .Input("values: float")
    .Input("segment_ids: int32")
    .Output("out: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle sums, values, ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &sums));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &ids));
      DimensionHandle edges, width;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(values, 0), c->Dim(ids, 0), &edges));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(values, 1), c->Dim(sums, 1), &width));
      c->set_output(0, c->Matrix(c->Dim(sums, 0), width));
      return Status();
    });

REGISTER_OP("HvdtrackGatherSumGrad")
    .Input("upstream: float")
    .Input("mask: uint8")
    .Input("receivers: int32")
    .Input("senders: int32")
    .Input("num_nodes: int32")
    .Input("receiver_sums_in: float")
    .Input("sender_sums_in: float")
    .Attr("relu: bool")
    .Output("edges: float")
    .Output("receiver_sums: float")
    .Output("sender_sums: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle upstream, mask, recv, send, scalar;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &upstream));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &mask));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &recv));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &send));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &scalar));
      ShapeHandle sums_in;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 2, &sums_in));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(6), 2, &sums_in));
      DimensionHandle edges, nodes;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(upstream, 0), c->Dim(recv, 0), &edges));
      TF_RETURN_IF_ERROR(c->Merge(edges, c->Dim(send, 0), &edges));
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(4, &nodes));
      c->set_output(0, upstream);
      c->set_output(1, c->Matrix(nodes, c->Dim(upstream, 1)));
      c->set_output(2, c->Matrix(nodes, c->Dim(upstream, 1)));
      return Status();
    });

namespace {

inline void AddRow(const float* row, float* out, int64 width) {
#pragma omp simd
  for (int64 c = 0; c < width; ++c) out[c] += row[c];
}

// Checks values [E, W] and segment_ids [E] (every id in [0, segments)); the name is the op's.
Status CheckEdges(const char* name, const Tensor& values, const Tensor& segment_ids,
                  int64 segments) {
  if (values.dims() != 2) {
    return ::tensorflow::errors::InvalidArgument(
        name, ": values must be [edges, width], got shape ", values.shape().DebugString());
  }
  if (segment_ids.dims() != 1 || segment_ids.dim_size(0) != values.dim_size(0)) {
    return ::tensorflow::errors::InvalidArgument(
        name, ": segment_ids must be [edges] = [", values.dim_size(0), "], got shape ",
        segment_ids.shape().DebugString());
  }
  const int32_t* ids = segment_ids.flat<int32_t>().data();
  const int64 edges = values.dim_size(0);  // (not called per edge in the loop's test)
  for (int64 e = 0; e < edges; ++e) {
    if (ids[e] < 0 || ids[e] >= segments) {
      return ::tensorflow::errors::InvalidArgument(name, ": segment_ids[", e, "] = ", ids[e],
                                                   " is out of range [0, ", segments, "): edge ", e,
                                                   " names no segment");
    }
  }
  return Status();
}

// Edges per unit of work for the ReLU mask on many threads (only the split depends on it).
constexpr int64 kBlockEdges = 1024;

// sums[ids[e]] += values[e] for edges e in ascending order, on the calling thread.
void AddInOrder(const float* vp, const int32_t* ids, int64 edges, int64 width, float* sp) {
  for (int64 e = 0; e < edges; ++e) {
    if (e + kPrefetchRows < edges) Prefetch(sp + ids[e + kPrefetchRows] * width, width);
    AddRow(vp + e * width, sp + ids[e] * width, width);
  }
}

// The parts of [0, segments) that threads sum: cuts[p] <= s < cuts[p + 1], each range with
// about as many of the edges' ids as the others. Only the split of the work depends on it,
// never a value.
std::vector<int64> BalancedCuts(const int32_t* ids, int64 edges, int64 segments, int64 parts) {
  std::vector<int64> count(segments, 0);
  for (int64 e = 0; e < edges; ++e) ++count[ids[e]];
  std::vector<int64> cuts(1, 0);
  int64 seen = 0;
  for (int64 s = 0; s < segments && static_cast<int64>(cuts.size()) < parts; ++s) {
    seen += count[s];
    while (static_cast<int64>(cuts.size()) < parts &&
           seen * parts >= edges * static_cast<int64>(cuts.size())) {
      cuts.push_back(s + 1);
    }
  }
  cuts.resize(parts + 1, segments);
  cuts[parts] = segments;
  return cuts;
}

// Runs part(first, end) for each range [cuts[p], cuts[p + 1]) on TensorFlow's intra-op threads.
template <typename Part>
void ForEachPart(OpKernelContext* context, const std::vector<int64>& cuts, int64 cost,
                 const Part& part) {
  const int64 parts = static_cast<int64>(cuts.size()) - 1;
  auto* workers = context->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(parts, workers->workers, parts, cost, [&](int64 begin, int64 end) {
    for (int64 p = begin; p < end; ++p) part(cuts[p], cuts[p + 1]);
  });
}

// sums[s] += values[e] for the edges e with first <= s = ids[e] < end, in ascending edge
// order: every id is read, the rows of the others are not.
void AddInRange(const float* vp, const int32_t* ids, int64 edges, int64 width, int64 first,
                int64 end, float* sp) {
  for (int64 e = 0; e < edges; ++e) {
    if (e + kPrefetchRows < edges) {  // the part's next rows lie anywhere: request them ahead
      const int64 ahead = ids[e + kPrefetchRows];
      if (ahead >= first && ahead < end) {
        Prefetch(vp + (e + kPrefetchRows) * width, width);
        Prefetch(sp + ahead * width, width);
      }
    }
    const int64 s = ids[e];
    if (s >= first && s < end) AddRow(vp + e * width, sp + s * width, width);
  }
}

// The threads' parts: one per thread, at most one per kBlockSegments segments, at least one.
int64 Parts(OpKernelContext* context, int64 segments) {
  const int64 threads = context->device()->tensorflow_cpu_worker_threads()->num_threads;
  return std::max<int64>(1, std::min(threads, segments / kBlockSegments));
}

// sums[ids[e]] += values[e] for every edge e, each row's edges in ascending order. With
// zero_first each row is set to zeros first (in the same pass, so that the threads write it).
void AddSegments(OpKernelContext* context, const Tensor& values, const Tensor& segment_ids,
                 bool zero_first, Tensor* sums) {
  const int64 segments = sums->dim_size(0), edges = values.dim_size(0);
  const int64 width = values.dim_size(1);
  if (segments == 0 || width == 0) return;
  const int32_t* ids = segment_ids.flat<int32_t>().data();
  const float* vp = values.flat<float>().data();
  float* sp = sums->flat<float>().data();
  const int64 parts = Parts(context, segments);
  if (parts == 1) {
    // One thread: TensorFlow's own loop, the values read once in order. Each row gets its
    // edges in ascending order too, so the sums are those of the parts below.
    if (zero_first) std::fill(sp, sp + segments * width, 0.f);
    AddInOrder(vp, ids, edges, width, sp);
    return;
  }
  // A part's cost: its rows zeroed, about edges / parts rows read and added, all ids scanned.
  const int64 cost = (edges + segments) / parts * width * kCyclesPerFloat + edges;
  ForEachPart(context, BalancedCuts(ids, edges, segments, parts), cost,
              [&](int64 first, int64 end) {
                // zeros first, as TensorFlow's: -0.0 sums to +0.0
                if (zero_first) std::fill(sp + first * width, sp + end * width, 0.f);
                AddInRange(vp, ids, edges, width, first, end, sp);
              });
}

}  // namespace

class SegmentSumOp : public OpKernel {
 public:
  explicit SegmentSumOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& values = context->input(0);
    const Tensor& segment_ids = context->input(1);
    const Tensor& num_segments = context->input(2);
    OP_REQUIRES(context, num_segments.dims() == 0,
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackSegmentSum: num_segments must be a scalar, got shape ",
                    num_segments.shape().DebugString()));
    const int64 segments = num_segments.scalar<int32_t>()();
    OP_REQUIRES(context, segments >= 0,
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackSegmentSum: num_segments must be >= 0, got ", segments));
    OP_REQUIRES_OK(context, CheckEdges("HvdtrackSegmentSum", values, segment_ids, segments));
    Tensor* sums;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({segments, values.dim_size(1)}), &sums));
    AddSegments(context, values, segment_ids, /*zero_first=*/true, sums);
  }
};

class SegmentAddOp : public OpKernel {
 public:
  explicit SegmentAddOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& sums = context->input(0);
    const Tensor& values = context->input(1);
    const Tensor& segment_ids = context->input(2);
    OP_REQUIRES(context, sums.dims() == 2 && values.dims() == 2 &&
                             sums.dim_size(1) == values.dim_size(1),
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackSegmentAdd: sums [segments, width] and values [edges, width] must "
                    "have one width, got shapes ",
                    sums.shape().DebugString(), " and ", values.shape().DebugString()));
    OP_REQUIRES_OK(context,
                   CheckEdges("HvdtrackSegmentAdd", values, segment_ids, sums.dim_size(0)));
    Tensor* out;
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, sums.shape(), &out));
    if (out->flat<float>().data() != sums.flat<float>().data()) {  // not handed over: a copy
      std::copy_n(sums.flat<float>().data(), sums.NumElements(), out->flat<float>().data());
    }
    AddSegments(context, values, segment_ids, /*zero_first=*/false, out);
  }
};

class GatherSumGradOp : public OpKernel {
 public:
  explicit GatherSumGradOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("relu", &relu_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& upstream = context->input(0);
    const Tensor& mask = context->input(1);
    const Tensor& receivers = context->input(2);
    const Tensor& senders = context->input(3);
    const Tensor& num_nodes = context->input(4);
    const int64 bytes = relu_ && upstream.dims() == 2 ? MaskBytes(upstream.dim_size(1)) : 0;
    OP_REQUIRES(context,
                upstream.dims() == 2 &&
                    mask.shape() == TensorShape({upstream.dim_size(0), bytes}),
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackGatherSumGrad: upstream must be [edges, width] and mask [edges, ",
                    bytes, "], got ", upstream.shape().DebugString(), " and ",
                    mask.shape().DebugString()));
    OP_REQUIRES(context, num_nodes.dims() == 0,
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackGatherSumGrad: num_nodes must be a scalar, got shape ",
                    num_nodes.shape().DebugString()));
    const int64 nodes = num_nodes.scalar<int32_t>()();
    OP_REQUIRES(context, nodes >= 0,
                ::tensorflow::errors::InvalidArgument(
                    "HvdtrackGatherSumGrad: num_nodes must be >= 0, got ", nodes));
    OP_REQUIRES_OK(context,
                   CheckEdges("HvdtrackGatherSumGrad: receivers", upstream, receivers, nodes));
    OP_REQUIRES_OK(context,
                   CheckEdges("HvdtrackGatherSumGrad: senders", upstream, senders, nodes));
    const int64 edges = upstream.dim_size(0), width = upstream.dim_size(1);
    const TensorShape sums_shape({nodes, width});
    bool onto[2];
    for (int i = 0; i < 2; ++i) {
      const Tensor& in = context->input(5 + i);
      onto[i] = in.shape() == sums_shape;
      OP_REQUIRES(context, onto[i] || in.shape() == TensorShape({0, width}),
                  ::tensorflow::errors::InvalidArgument(
                      "HvdtrackGatherSumGrad: ", i == 0 ? "receiver" : "sender",
                      "_sums_in must be [num_nodes, width] = ", sums_shape.DebugString(),
                      " or [0, width], got ", in.shape().DebugString()));
    }
    Tensor *grad, *sums[2];
    OP_REQUIRES_OK(context,
                   context->forward_input_or_allocate_output({0}, 0, upstream.shape(), &grad));
    for (int i = 0; i < 2; ++i) {
      const Tensor& in = context->input(5 + i);
      if (!onto[i]) {
        OP_REQUIRES_OK(context, context->allocate_output(1 + i, sums_shape, &sums[i]));
        std::fill_n(sums[i]->flat<float>().data(), nodes * width, 0.f);
        continue;
      }
      OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({5 + i}, 1 + i,
                                                                        sums_shape, &sums[i]));
      if (sums[i]->flat<float>().data() != in.flat<float>().data()) {  // not handed over
        std::copy_n(in.flat<float>().data(), nodes * width, sums[i]->flat<float>().data());
      }
    }
    Tensor *receiver_sums = sums[0], *sender_sums = sums[1];
    const float* up = upstream.flat<float>().data();
    const uint8_t* bits = mask.flat<uint8_t>().data();
    float* gp = grad->flat<float>().data();
    const bool relu = relu_;
    auto* workers = context->device()->tensorflow_cpu_worker_threads();
    if (Parts(context, nodes) == 1) {
      // One pass: each edge's row masked, then added into its receiver's and sender's rows,
      // in ascending edge order (HvdtrackSegmentSum's order).
      float* rp = receiver_sums->flat<float>().data();
      float* sp = sender_sums->flat<float>().data();
      const int32_t* recv = receivers.flat<int32_t>().data();
      const int32_t* send = senders.flat<int32_t>().data();
      for (int64 e = 0; e < edges; ++e) {
        if (e + kPrefetchRows < edges) {  // the rows lie anywhere: request them ahead
          Prefetch(rp + recv[e + kPrefetchRows] * width, width);
          Prefetch(sp + send[e + kPrefetchRows] * width, width);
        }
        const float* u = up + e * width;
        float* g = gp + e * width;
        float* to_r = rp + recv[e] * width;
        float* to_s = sp + send[e] * width;
        if (relu) {
          MaskedProduct(bits + e * bytes, u, width, g);
        } else if (g != u) {
          std::copy_n(u, width, g);
        }
        AddRow(g, to_r, width);
        AddRow(g, to_s, width);
      }
      return;
    }
    const int64 blocks = (edges + kBlockEdges - 1) / kBlockEdges;
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, blocks, kBlockEdges * width * 3,
        [&](int64 begin, int64 end) {
          const int64 first = begin * kBlockEdges, last = std::min(edges, end * kBlockEdges);
          if (relu) {
            for (int64 e = first; e < last; ++e) {
              MaskedProduct(bits + e * bytes, up + e * width, width, gp + e * width);
            }
          } else if (gp != up) {
            std::copy(up + first * width, up + last * width, gp + first * width);
          }
        });
    if (workers->num_threads == 2) {
      // Two threads: one adds the rows per receiver, the other per sender, each in ascending
      // edge order as the one-thread pass does, without sorting the ids.
      const int32_t* ids[2] = {receivers.flat<int32_t>().data(), senders.flat<int32_t>().data()};
      float* sums_of[2] = {receiver_sums->flat<float>().data(),
                           sender_sums->flat<float>().data()};
      ::tensorflow::Shard(2, workers->workers, 2, edges * width * kCyclesPerFloat,
                          [&](int64 begin, int64 end) {
                            for (int64 k = begin; k < end; ++k) {
                              AddInOrder(gp, ids[k], edges, width, sums_of[k]);
                            }
                          });
      return;
    }
    AddSegments(context, *grad, receivers, /*zero_first=*/false, receiver_sums);
    AddSegments(context, *grad, senders, /*zero_first=*/false, sender_sums);
  }

 private:
  bool relu_;
};

REGISTER_KERNEL_BUILDER(Name("HvdtrackSegmentSum").Device(::tensorflow::DEVICE_CPU), SegmentSumOp);
REGISTER_KERNEL_BUILDER(Name("HvdtrackGatherSumGrad").Device(::tensorflow::DEVICE_CPU),
                        GatherSumGradOp);
REGISTER_KERNEL_BUILDER(Name("HvdtrackSegmentAdd").Device(::tensorflow::DEVICE_CPU), SegmentAddOp);

}  // namespace hvdtrack
