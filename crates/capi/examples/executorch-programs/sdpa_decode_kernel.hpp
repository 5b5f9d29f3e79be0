// ca_example::sdpa_decode_scratch.out: ExecuTorch's SDPA decode scratch pattern as a kernel
// registered with ExecuTorch's kernel registry. sdpa_decode.pte (scripts/executorch-pte.py)
// calls it once per layer with the KV length as its input tensor.
#ifndef CA_EXAMPLE_SDPA_DECODE_KERNEL_HPP
#define CA_EXAMPLE_SDPA_DECODE_KERNEL_HPP

#include <executorch/runtime/core/error.h>

#include <cstddef>
#include <cstdint>

namespace ca_example {

// The largest KV length the kernel accepts (its synthetic int8 K/V cache holds this many rows).
constexpr int64_t kMaxKvLength = 4096;
// The largest head_dim it accepts.
constexpr int64_t kMaxHeadDim = 256;

// The bytes op_sdpa_impl.h's flash attention asks ctx.allocate_temp for, for one decode call
// (seq_len 1) over kv_length keys, float, int8-quantized KV:
//   accum   = threads * (qSplit*kvSplit + 2*qSplit + qSplit*head_dim) * 4
//   dequant = threads * kvSplit * head_dim * 4
// with qSplit = min(32, seq_len) = 1 and kvSplit = min(512, kv_length).
struct SdpaScratch {
  size_t accum_bytes;
  size_t dequant_bytes;
};
SdpaScratch sdpa_decode_scratch_bytes(int64_t kv_length, int64_t threads, int64_t head_dim);

// Registers the kernel (once; the K/V tables are filled on the first call of this function).
executorch::runtime::Error register_sdpa_decode_kernel();

}  // namespace ca_example

#endif
