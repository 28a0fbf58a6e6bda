// WindowCopy: windows of consecutive (or evenly spaced) rows, copied from a
// tensor of rows in one pass, one memcpy per window (per row when rows are
// spaced), outside the interpreter.
//
//   windows[i, k, ...] = rows[starts[i] + k * step, ...]   for k < length
//
// It is what tf.gather(rows, starts[:, None] + step * range(length)) returns,
// without gather's per-row work: windowkit cuts every batch of its tf.data
// readers with it. Every start is checked against the rows.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace windowkit {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace shape_inference = tensorflow::shape_inference;

REGISTER_OP("WindowkitWindowCopy")
    .Input("rows: T")
    .Input("starts: int64")
    .Attr("length: int >= 0")
    .Attr("step: int >= 1")
    .Attr("T: {bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, "
          "half, bfloat16, float, double}")
    .Output("windows: T")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int64_t length;
      TF_RETURN_IF_ERROR(c->GetAttr("length", &length));
      shape_inference::ShapeHandle rows, starts, row, out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &starts));
      TF_RETURN_IF_ERROR(c->Subshape(rows, 1, &row));
      TF_RETURN_IF_ERROR(c->Concatenate(starts, c->MakeShape({length}), &out));
      TF_RETURN_IF_ERROR(c->Concatenate(out, row, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    });

// how many windows ahead of the copy their first rows are asked for, and how
// many bytes (more stalls on the processor's few outstanding reads)
constexpr int64_t kAhead = 8;
constexpr int64_t kAheadBytes = 128;

class WindowCopyOp : public OpKernel {
 public:
  explicit WindowCopyOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("length", &length_));
    OP_REQUIRES_OK(context, context->GetAttr("step", &step_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& rows = context->input(0);
    const Tensor& starts = context->input(1);
    OP_REQUIRES(context, rows.dims() >= 1,
                tensorflow::errors::InvalidArgument("rows must have a first dimension"));
    OP_REQUIRES(context, starts.dims() == 1,
                tensorflow::errors::InvalidArgument("starts must be a vector"));
    const int64_t count = rows.dim_size(0);
    TensorShape shape({starts.dim_size(0), length_});
    for (int d = 1; d < rows.dims(); ++d) shape.AddDim(rows.dim_size(d));
    Tensor* windows = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, shape, &windows));
    const auto first = starts.flat<int64_t>();
    const int64_t reach = length_ == 0 ? 0 : (length_ - 1) * step_ + 1;  // rows a window spans
    for (int64_t i = 0; i < first.size(); ++i) {
      OP_REQUIRES(context, first(i) >= 0 && first(i) <= count - reach,
                  tensorflow::errors::InvalidArgument(
                      "window ", i, " starts at row ", first(i), ": its ", reach,
                      " rows are not all among the ", count, " rows"));
    }
    if (windows->NumElements() == 0) return;
    const int64_t row_bytes = rows.TotalBytes() / count;
    const char* source = rows.tensor_data().data();
    char* target = const_cast<char*>(windows->tensor_data().data());
    const int64_t window_bytes = row_bytes * length_;
    const int64_t span_bytes = row_bytes * ((length_ - 1) * step_ + 1);
    for (int64_t i = 0; i < first.size(); ++i) {
      if (i + kAhead < first.size()) {  // windows start at random rows: ask for a
        // later window's first lines now (its page, and the start of the stream
        // the hardware then follows), so that its reads overlap this copy
        const char* ahead = source + first(i + kAhead) * row_bytes;
        for (int64_t line = 0; line < std::min(span_bytes, kAheadBytes); line += 64) {
          __builtin_prefetch(ahead + line);
        }
      }
      const char* from = source + first(i) * row_bytes;
      char* to = target + i * window_bytes;
      if (step_ == 1) {
        std::memcpy(to, from, window_bytes);
      } else {
        for (int64_t k = 0; k < length_; ++k) {
          std::memcpy(to + k * row_bytes, from + k * step_ * row_bytes, row_bytes);
        }
      }
    }
  }

 private:
  int64_t length_;
  int64_t step_;
};

REGISTER_KERNEL_BUILDER(Name("WindowkitWindowCopy").Device(tensorflow::DEVICE_CPU),
                        WindowCopyOp);

}  // namespace windowkit
