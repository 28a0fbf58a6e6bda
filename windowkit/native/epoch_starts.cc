// EpochStarts: where the windows at positions [lo, hi) of a shuffled epoch
// start in the held rows, and their series, in one pass outside the
// interpreter. For each position p:
//
//   w      = keyed permutation of [0, size) at p      (Feistel, cycle walking)
//   run    = the last run with run_first[run] <= w     (runs of the split's index)
//   start  = run_start[run] + (w - run_first[run]) * stride   (a global row)
//   block  = start / block_rows
//   at     = block_base[block] + start - block * block_rows   (a held row)
//   series = run_series[run]
//
// The permutation is windowkit.readers.epoch.permutation's, bit for bit (the
// NumPy readers' order); what it replaces is about 50 graph ops per chunk.
// Every lookup is checked: a bad table is an InvalidArgumentError.

#include <algorithm>
#include <cstdint>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace windowkit {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace errors = tensorflow::errors;
namespace shape_inference = tensorflow::shape_inference;

REGISTER_OP("WindowkitEpochStarts")
    .Input("lo: int64")
    .Input("hi: int64")
    .Input("size: int64")
    .Input("key: uint64")
    .Input("run_first: int64")
    .Input("run_start: int64")
    .Input("run_series: int32")
    .Input("block_base: int64")
    .Attr("stride: int >= 1")
    .Attr("block_rows: int >= 1")
    .Output("at: int64")
    .Output("series: int32")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle scalar, vector;
      for (int i = 0; i < 4; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &scalar));
      for (int i = 4; i < 8; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &vector));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2**64 / golden ratio
constexpr uint64_t kOdd = 0xD6E8FEB86659FD93ull;     // the round hash's multiplier
constexpr int kRounds = 4;

// splitmix64's finalizer (permutation.mix)
inline uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A keyed pseudo-random permutation of [0, size) (permutation.KeyedPermutations).
class KeyedPermutation {
 public:
  KeyedPermutation(int64_t size, uint64_t key) : limit_(static_cast<uint64_t>(size)) {
    const uint64_t top = static_cast<uint64_t>(std::max<int64_t>(size - 1, 1));
    const int bits = std::max(2, 64 - __builtin_clzll(top));
    low_bits_ = bits - bits / 2;
    low_mask_ = (uint64_t{1} << low_bits_) - 1;
    high_mask_ = (uint64_t{1} << (bits / 2)) - 1;
    for (int r = 0; r < kRounds; ++r) keys_[r] = Mix(key + kGolden * (r + 1));
  }

  uint64_t operator()(uint64_t index) const {
    uint64_t out = Feistel(index);
    while (out >= limit_) out = Feistel(out);  // cycle walking
    return out;
  }

 private:
  uint64_t Feistel(uint64_t x) const {
    uint64_t high = x >> low_bits_, low = x & low_mask_;
    for (int r = 0; r < kRounds; ++r) {
      if (r % 2) {
        const uint64_t f = (high ^ keys_[r]) * kOdd;
        low ^= (f ^ (f >> 32)) & low_mask_;
      } else {
        const uint64_t f = (low ^ keys_[r]) * kOdd;
        high ^= (f ^ (f >> 32)) & high_mask_;
      }
    }
    return (high << low_bits_) | low;
  }

  uint64_t limit_;
  int low_bits_;
  uint64_t low_mask_, high_mask_;
  uint64_t keys_[kRounds];
};

class EpochStartsOp : public OpKernel {
 public:
  explicit EpochStartsOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("stride", &stride_));
    OP_REQUIRES_OK(context, context->GetAttr("block_rows", &block_rows_));
  }

  void Compute(OpKernelContext* context) override {
    const int64_t lo = context->input(0).scalar<int64_t>()();
    const int64_t hi = context->input(1).scalar<int64_t>()();
    const int64_t size = context->input(2).scalar<int64_t>()();
    const uint64_t key = context->input(3).scalar<uint64_t>()();
    const auto run_first = context->input(4).flat<int64_t>();
    const auto run_start = context->input(5).flat<int64_t>();
    const auto run_series = context->input(6).flat<int32_t>();
    const auto block_base = context->input(7).flat<int64_t>();
    const int64_t runs = run_first.size(), blocks = block_base.size();
    OP_REQUIRES(context, 0 <= lo && lo <= hi && hi <= size,
                errors::InvalidArgument("positions [", lo, ", ", hi,
                                        ") are not within the epoch's ", size, " windows"));
    OP_REQUIRES(context, run_start.size() == runs && run_series.size() == runs,
                errors::InvalidArgument("run tables of ", runs, ", ", run_start.size(), " and ",
                                        run_series.size(), " entries"));
    Tensor* at_out = nullptr;
    Tensor* series_out = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({hi - lo}), &at_out));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({hi - lo}), &series_out));
    auto at = at_out->flat<int64_t>();
    auto series = series_out->flat<int32_t>();
    const KeyedPermutation permute(size, key);
    const int64_t* first = run_first.data();
    for (int64_t i = 0; i < hi - lo; ++i) {
      const int64_t w = static_cast<int64_t>(permute(static_cast<uint64_t>(lo + i)));
      const int64_t run = std::upper_bound(first, first + runs, w) - first - 1;
      OP_REQUIRES(context, run >= 0,
                  errors::InvalidArgument("window ", w, " precedes the first run"));
      const int64_t start = run_start(run) + (w - first[run]) * stride_;
      const int64_t block = start / block_rows_;
      OP_REQUIRES(context, start >= 0 && block < blocks && block_base(block) >= 0,
                  errors::InvalidArgument("window ", w, " starts at row ", start,
                                          ", in a block that is not held"));
      at(i) = block_base(block) + start - block * block_rows_;
      series(i) = run_series(run);
    }
  }

 private:
  int64_t stride_;
  int64_t block_rows_;
};

REGISTER_KERNEL_BUILDER(Name("WindowkitEpochStarts").Device(tensorflow::DEVICE_CPU),
                        EpochStartsOp);

}  // namespace windowkit
