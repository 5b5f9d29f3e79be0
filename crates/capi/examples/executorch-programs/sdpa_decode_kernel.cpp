// See sdpa_decode_kernel.hpp. The kernel runs a flash-attention decode step the way
// op_sdpa_impl.h does for an int8 KV cache: per head, walk the keys in blocks of kvSplit,
// dequantize each block into the dequant scratch, keep the scores, row max, row sum and output
// accumulator in the accum scratch (one slab per thread; here the heads take the slabs in
// turn, on one thread). It then recomputes the same result without any scratch (dequantizing
// inline, the same float operations in the same order) and fails the call unless the two are
// bit-equal: a temp allocator that handed out overlapping or too small blocks shows here.
#include "sdpa_decode_kernel.hpp"

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/log.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::Kernel;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::Span;

namespace ca_example {
namespace {

constexpr int64_t kKvSplit = 512;  // op_sdpa_impl.h's kv split
constexpr int64_t kQSplit = 1;     // min(32, seq_len) for decode

// Synthetic int8 K and V caches (one set of rows, shared by all heads and layers, which only
// change the query and the scales), filled once by register_sdpa_decode_kernel.
int8_t k_cache[kMaxKvLength * kMaxHeadDim];
int8_t v_cache[kMaxKvLength * kMaxHeadDim];

int8_t pseudo_random_int8(uint32_t& state) {
  state = state * 1664525u + 1013904223u;
  return static_cast<int8_t>(state >> 24);
}

float query(int64_t layer, int64_t head, int64_t d) {
  return static_cast<float>(((layer * 7 + head * 13 + d * 5) % 17) - 8) * 0.125f;
}

float k_scale(int64_t layer) { return 0.01f + 0.0005f * static_cast<float>(layer); }
float v_scale(int64_t layer) { return 0.02f - 0.0003f * static_cast<float>(layer); }

// One head with the scratch: accum holds [scores kvSplit][row max][row sum][acc head_dim]
// (qSplit = 1), dequant holds kvSplit rows of head_dim floats. Returns sum_d out[d].
float head_with_scratch(float* accum, float* dequant, int64_t kv, int64_t kv_split,
                        int64_t layer, int64_t head, int64_t dim) {
  float* scores = accum;
  float* row_max = scores + kQSplit * kv_split;
  float* row_sum = row_max + kQSplit;
  float* acc = row_sum + kQSplit;
  // Temp memory is not zeroed: set what is read.
  *row_max = -std::numeric_limits<float>::infinity();
  *row_sum = 0.0f;
  std::fill(acc, acc + dim, 0.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  for (int64_t start = 0; start < kv; start += kv_split) {
    const int64_t n = std::min(kv_split, kv - start);
    for (int64_t j = 0; j < n; j++) {
      for (int64_t d = 0; d < dim; d++) {
        dequant[j * dim + d] = k_scale(layer) * static_cast<float>(k_cache[(start + j) * dim + d]);
      }
    }
    float block_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; j++) {
      float s = 0.0f;
      for (int64_t d = 0; d < dim; d++) s += query(layer, head, d) * dequant[j * dim + d];
      scores[j] = s * scale;
      block_max = std::max(block_max, scores[j]);
    }
    const float new_max = std::max(*row_max, block_max);
    const float correction = std::exp(*row_max - new_max);
    *row_sum *= correction;
    for (int64_t d = 0; d < dim; d++) acc[d] *= correction;
    for (int64_t j = 0; j < n; j++) {
      for (int64_t d = 0; d < dim; d++) {
        dequant[j * dim + d] = v_scale(layer) * static_cast<float>(v_cache[(start + j) * dim + d]);
      }
    }
    for (int64_t j = 0; j < n; j++) {
      const float p = std::exp(scores[j] - new_max);
      *row_sum += p;
      for (int64_t d = 0; d < dim; d++) acc[d] += p * dequant[j * dim + d];
    }
    *row_max = new_max;
  }
  float total = 0.0f;
  for (int64_t d = 0; d < dim; d++) total += acc[d] / *row_sum;
  return total;
}

// The same computation with no scratch at all: every value recomputed where it is needed.
float head_without_scratch(int64_t kv, int64_t kv_split, int64_t layer, int64_t head,
                           int64_t dim) {
  float acc[kMaxHeadDim];
  float row_max = -std::numeric_limits<float>::infinity();
  float row_sum = 0.0f;
  std::fill(acc, acc + dim, 0.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  auto score = [&](int64_t row) {
    float s = 0.0f;
    for (int64_t d = 0; d < dim; d++) {
      s += query(layer, head, d) * (k_scale(layer) * static_cast<float>(k_cache[row * dim + d]));
    }
    return s * scale;
  };
  for (int64_t start = 0; start < kv; start += kv_split) {
    const int64_t n = std::min(kv_split, kv - start);
    float block_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; j++) block_max = std::max(block_max, score(start + j));
    const float new_max = std::max(row_max, block_max);
    const float correction = std::exp(row_max - new_max);
    row_sum *= correction;
    for (int64_t d = 0; d < dim; d++) acc[d] *= correction;
    for (int64_t j = 0; j < n; j++) {
      const float p = std::exp(score(start + j) - new_max);
      row_sum += p;
      for (int64_t d = 0; d < dim; d++) {
        acc[d] += p * (v_scale(layer) * static_cast<float>(v_cache[(start + j) * dim + d]));
      }
    }
    row_max = new_max;
  }
  float total = 0.0f;
  for (int64_t d = 0; d < dim; d++) total += acc[d] / row_sum;
  return total;
}

// ca_example::sdpa_decode_scratch.out(Tensor kv_len, int layer, int threads, int heads,
//     int head_dim, *, Tensor(a!) out) -> Tensor(a!); the stack ends with the return value.
void sdpa_decode_scratch_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  if (stack.size() != 7 || !stack[0]->isTensor() || !stack[5]->isTensor()) {
    ET_LOG(Error, "sdpa_decode_scratch.out: expected 7 arguments (kv_len, layer, threads, "
                  "heads, head_dim, out, return); regenerate the program with "
                  "scripts/executorch-pte.py");
    ctx.fail(Error::InvalidProgram);
    return;
  }
  const Tensor& kv_len = stack[0]->toTensor();
  const int64_t layer = stack[1]->toInt();
  const int64_t threads = stack[2]->toInt();
  const int64_t heads = stack[3]->toInt();
  const int64_t dim = stack[4]->toInt();
  Tensor& out = stack[5]->toTensor();
  if (kv_len.scalar_type() != executorch::aten::ScalarType::Long || kv_len.numel() != 1 ||
      out.scalar_type() != executorch::aten::ScalarType::Float || layer < 0 ||
      layer >= out.numel() || threads < 1 || heads < 1 || dim < 1 || dim > kMaxHeadDim) {
    ET_LOG(Error, "sdpa_decode_scratch.out: bad arguments (layer %lld, threads %lld, heads "
                  "%lld, head_dim %lld)",
           static_cast<long long>(layer), static_cast<long long>(threads),
           static_cast<long long>(heads), static_cast<long long>(dim));
    ctx.fail(Error::InvalidArgument);
    return;
  }
  const int64_t kv = kv_len.const_data_ptr<int64_t>()[0];
  if (kv < 1 || kv > kMaxKvLength) {
    ET_LOG(Error, "sdpa_decode_scratch.out: KV length %lld outside [1, %lld]",
           static_cast<long long>(kv), static_cast<long long>(kMaxKvLength));
    ctx.fail(Error::InvalidArgument);
    return;
  }
  const int64_t kv_split = std::min(kKvSplit, kv);
  const SdpaScratch sizes = sdpa_decode_scratch_bytes(kv, threads, dim);
  auto accum = ctx.allocate_temp(sizes.accum_bytes, 64);
  auto dequant = ctx.allocate_temp(sizes.dequant_bytes, 64);
  if (!accum.ok() || !dequant.ok()) {
    // op_sdpa falls back to the heap here; this kernel reports it, so that a temp allocator
    // sized too small is seen, not hidden.
    ET_LOG(Error, "sdpa_decode_scratch.out: allocate_temp refused %zu + %zu bytes (layer %lld)",
           sizes.accum_bytes, sizes.dequant_bytes, static_cast<long long>(layer));
    ctx.fail(Error::MemoryAllocationFailed);
    return;
  }
  const size_t accum_per_thread = sizes.accum_bytes / sizeof(float) / threads;
  const size_t dequant_per_thread = sizes.dequant_bytes / sizeof(float) / threads;
  float result = 0.0f;
  float reference = 0.0f;
  for (int64_t h = 0; h < heads; h++) {
    const int64_t slab = h % threads;
    result += head_with_scratch(static_cast<float*>(accum.get()) + slab * accum_per_thread,
                                static_cast<float*>(dequant.get()) + slab * dequant_per_thread,
                                kv, kv_split, layer, h, dim);
    reference += head_without_scratch(kv, kv_split, layer, h, dim);
  }
  if (std::memcmp(&result, &reference, sizeof(float)) != 0) {
    ET_LOG(Error, "sdpa_decode_scratch.out: layer %lld, KV %lld: %.9g with scratch, %.9g "
                  "without: the temp allocator's blocks were not private",
           static_cast<long long>(layer), static_cast<long long>(kv), result, reference);
    ctx.fail(Error::Internal);
    return;
  }
  out.mutable_data_ptr<float>()[layer] = result;
}

}  // namespace

SdpaScratch sdpa_decode_scratch_bytes(int64_t kv_length, int64_t threads, int64_t head_dim) {
  const int64_t kv_split = std::min(kKvSplit, kv_length);
  const int64_t accum = threads * (kQSplit * kv_split + 2 * kQSplit + kQSplit * head_dim);
  const int64_t dequant = threads * kv_split * head_dim;
  return {static_cast<size_t>(accum) * sizeof(float), static_cast<size_t>(dequant) * sizeof(float)};
}

Error register_sdpa_decode_kernel() {
  static bool registered = false;
  if (registered) return Error::Ok;
  uint32_t state = 12345;
  for (auto& x : k_cache) x = pseudo_random_int8(state);
  for (auto& x : v_cache) x = pseudo_random_int8(state);
  static const Kernel kernel("ca_example::sdpa_decode_scratch.out", sdpa_decode_scratch_out);
  const Error e = executorch::runtime::register_kernel(kernel);
  registered = e == Error::Ok;
  return e;
}

}  // namespace ca_example
