// Runs an ExecuTorch program (.pte, e.g. from scripts/executorch-pte.py) with ExecuTorch's own
// Program/Method and a MemoryManager whose temp allocator is the one named, driving the Method
// directly (set_input / execute / get_output, so the runtime itself allocates nothing per
// execute), and prints one JSON record: time per execute (median, min, max over rounds), heap
// calls and page faults per execute after a warm-up round, the temp high-water mark, failed
// allocate_temp calls, and a hash of every output (equal across allocators, checked by
// scripts/executorch-programs.sh).
//
//   executorch_programs --allocator NAME [--rounds N] [--quick] [--fixed-bytes N] PROGRAM.pte
//
// NAME: malloc       ExecuTorch's MallocMemoryAllocator (Module's default): malloc per call
//       platform     ExecuTorch's PlatformMemoryAllocator (Method's default without a temp
//                    allocator): one et_pal_allocate per call, all freed at reset
//       exact-cache  ExecuTorch's CPUCachingAllocator design, re-implemented (temp_allocators.hpp)
//       caching      caching_allocator::ExecuTorchTempAllocator(10 MiB), as the LLM runner
//                    builds CPUCachingAllocator
//       fixed        a MemoryAllocator over one pre-sized buffer (default 8 MiB): the floor
//
// The program's first input decides the workload: float -> top-k over a fixed row of logits
// (every result also checked against std::partial_sort); an int64 [1] tensor -> one decode
// "conversation" per round, KV length 1, 1+stride, ... up to 640 (the sdpa kernel checks
// itself). A file ExecuTorch cannot load is an error (exit 2), never a crash.
#include <caching_allocator_executorch.hpp>
#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/core/memory_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/platform_memory_allocator.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "heap_count.hpp"
#include "sdpa_decode_kernel.hpp"
#include "temp_allocators.hpp"

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using executorch::extension::BufferDataLoader;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::HierarchicalAllocator;
using executorch::runtime::MemoryAllocator;
using executorch::runtime::MemoryManager;
using executorch::runtime::Method;
using executorch::runtime::MethodMeta;
using executorch::runtime::Program;
using executorch::runtime::Span;

namespace {

constexpr size_t kCachingCap = 10 * 1024 * 1024;  // the LLM runner's CPUCachingAllocator cap
constexpr int64_t kTopK = 40;
constexpr int64_t kDecodeMaxKv = 640;  // crosses op_sdpa's kvSplit of 512

struct Options {
  std::string allocator;
  std::string program;
  int rounds = 5;
  bool quick = false;
  size_t fixed_bytes = 8 << 20;
  std::string plan;  // --plan FILE: the temp plan of the warm-up round (allocator "caching")
};

[[noreturn]] void usage_error(const char* what) {
  std::fprintf(stderr,
               "executorch_programs: %s\nusage: executorch_programs --allocator "
               "malloc|platform|exact-cache|caching|fixed [--rounds N] [--quick] "
               "[--fixed-bytes N] [--plan FILE] PROGRAM.pte\n",
               what);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--allocator") {
      o.allocator = value();
    } else if (a == "--rounds") {
      o.rounds = std::atoi(value());
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--plan") {
      o.plan = value();
    } else if (a == "--fixed-bytes") {
      o.fixed_bytes = std::strtoull(value(), nullptr, 10);
    } else if (!a.empty() && a[0] == '-') {
      usage_error(("unknown option " + a).c_str());
    } else if (o.program.empty()) {
      o.program = a;
    } else {
      usage_error("give one program");
    }
  }
  if (o.program.empty()) usage_error("give a program (.pte)");
  if (o.rounds < 1) usage_error("--rounds must be at least 1");
  if (!o.plan.empty() && o.allocator != "caching") usage_error("--plan needs --allocator caching");
  return o;
}

// The temp allocator under test, behind the counting wrapper every one of them gets.
struct TempAllocator {
  std::unique_ptr<MemoryAllocator> inner;
  std::vector<uint8_t> fixed_buffer;  // only for "fixed"
  std::unique_ptr<ca_example::Counting> counting;
};

bool make_temp_allocator(const Options& o, TempAllocator& t) {
  if (o.allocator == "malloc") {
    t.inner = std::make_unique<executorch::extension::MallocMemoryAllocator>();
  } else if (o.allocator == "platform") {
    t.inner = std::make_unique<executorch::runtime::internal::PlatformMemoryAllocator>();
  } else if (o.allocator == "exact-cache") {
    t.inner = std::make_unique<ca_example::ExactSizeCache>(static_cast<uint32_t>(kCachingCap));
  } else if (o.allocator == "caching") {
    auto a = std::make_unique<caching_allocator::ExecuTorchTempAllocator>(kCachingCap);
    if (!a->ok()) {
      std::fprintf(stderr, "executorch_programs: ExecuTorchTempAllocator: %s\n",
                   ca_last_error(nullptr).message);
      return false;
    }
    t.inner = std::move(a);
  } else if (o.allocator == "fixed") {
    if (o.fixed_bytes > UINT32_MAX) usage_error("--fixed-bytes must fit in 32 bits");
    // Touched once now, so that executes find it mapped: the floor. The allocator's base is
    // 64-byte aligned, so that a buffer sized from the temp plan fits to the byte.
    t.fixed_buffer.assign(o.fixed_bytes + 64, 0);
    const uintptr_t raw = reinterpret_cast<uintptr_t>(t.fixed_buffer.data());
    auto* base = reinterpret_cast<uint8_t*>((raw + 63) & ~uintptr_t{63});
    t.inner = std::make_unique<MemoryAllocator>(static_cast<uint32_t>(o.fixed_bytes), base);
  } else {
    usage_error(("unknown allocator '" + o.allocator + "'").c_str());
  }
  t.counting = std::make_unique<ca_example::Counting>(*t.inner);
  return true;
}

uint64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_minflt);
}

void fnv(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
}

// One input tensor, its data owned here; set_input copies it into the planned buffer.
struct InputTensor {
  ScalarType type;
  std::vector<int32_t> sizes;
  std::vector<uint8_t> dim_order;
  std::vector<int32_t> strides;
  std::vector<uint8_t> data;
  std::unique_ptr<TensorImpl> impl;
};

enum class Workload { TopK, Decode };

constexpr size_t kPlanCapacity = 1 << 16;

// The temp plan of one round: prints the scratch of every kernel call of the round's last
// execute and the maximum, writes them all as JSON, checks the maximum equals the largest
// interval peak the allocator's stats showed after a reset (stats_max), and for the decode
// program that it equals op_sdpa's formula at the largest KV length. Returns the maximum, 0 if
// a check failed.
size_t write_temp_plan(const Options& o, const caching_allocator::ExecuTorchTempAllocator& a,
                       int executes, int64_t formula_bytes, size_t stats_max) {
  std::vector<size_t> peaks(kPlanCapacity);
  const CaPlanInfo info = a.read_temp_plan(peaks.data(), peaks.size());
  peaks.resize(info.stored);
  if (info.dropped != 0 || info.stored == 0 || info.stored % executes != 0) {
    std::fprintf(stderr, "executorch_programs: temp plan: %zu entries for %d executes, %llu "
                         "dropped\n", info.stored, executes,
                 static_cast<unsigned long long>(info.dropped));
    return 0;
  }
  // Method::execute resets the temp allocator before it runs and after every instruction:
  // each execute is one (empty) interval before its first kernel, then one per kernel call.
  const size_t per_execute = info.stored / executes;
  std::printf("temp plan of %s: %llu reset intervals over %d executes (%zu per execute: the "
              "reset before the first kernel, then one per kernel call)\n",
              o.program.c_str(), static_cast<unsigned long long>(info.intervals), executes,
              per_execute);
  std::printf("  last execute, bytes per kernel call:");
  for (size_t i = info.stored - per_execute + 1; i < info.stored; i++) std::printf(" %zu", peaks[i]);
  std::printf("\n  max over all kernel calls: %zu bytes\n", info.max_bytes);
  bool matches = info.max_bytes == stats_max;
  std::printf("  the largest last_interval_peak_bytes the stats showed after a reset: %zu: %s\n",
              stats_max, matches ? "equal" : "DIFFERENT");
  if (formula_bytes >= 0) {
    matches &= static_cast<int64_t>(info.max_bytes) == formula_bytes;
    std::printf("  op_sdpa_impl.h's formula at the largest KV length: %lld bytes: %s\n",
                static_cast<long long>(formula_bytes),
                static_cast<int64_t>(info.max_bytes) == formula_bytes ? "equal" : "DIFFERENT");
  }
  FILE* f = std::fopen(o.plan.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "executorch_programs: cannot write %s\n", o.plan.c_str());
    return 0;
  }
  std::fprintf(f, "{\"program\": \"%s\", \"executes\": %d, \"intervals_per_execute\": %zu, "
                  "\"max_bytes\": %zu, \"formula_bytes\": %lld, \"peaks\": [",
               o.program.c_str(), executes, per_execute, info.max_bytes,
               static_cast<long long>(formula_bytes));
  for (size_t i = 0; i < peaks.size(); i++) std::fprintf(f, "%s%zu", i ? ", " : "", peaks[i]);
  std::fprintf(f, "]}\n");
  std::fclose(f);
  return matches ? info.max_bytes : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  executorch::runtime::runtime_init();
  if (ca_example::register_sdpa_decode_kernel() != Error::Ok) {
    std::fprintf(stderr, "executorch_programs: could not register the sdpa decode kernel\n");
    return 1;
  }

  std::ifstream file(o.program, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "executorch_programs: cannot open %s\n", o.program.c_str());
    return 2;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  BufferDataLoader loader(bytes.data(), bytes.size());
  // InternalConsistency: the flatbuffer is verified, so a truncated or corrupt file is an
  // error here rather than a bad read later.
  auto program = Program::load(&loader, Program::Verification::InternalConsistency);
  if (!program.ok()) {
    std::fprintf(stderr,
                 "executorch_programs: %s is not an ExecuTorch program ExecuTorch can load "
                 "(Program::load: %s, %zu bytes): regenerate it with scripts/executorch-pte.py\n",
                 o.program.c_str(), executorch::runtime::to_string(program.error()), bytes.size());
    return 2;
  }
  auto meta = program->method_meta("forward");
  if (!meta.ok() || meta->num_inputs() != 1) {
    std::fprintf(stderr, "executorch_programs: %s has no method 'forward' with one input\n",
                 o.program.c_str());
    return 2;
  }
  auto input_meta = meta->input_tensor_meta(0);
  if (!input_meta.ok()) {
    std::fprintf(stderr, "executorch_programs: %s: input 0 is not a tensor\n", o.program.c_str());
    return 2;
  }
  InputTensor in;
  in.type = input_meta->scalar_type();
  in.sizes.assign(input_meta->sizes().begin(), input_meta->sizes().end());
  for (size_t d = 0; d < in.sizes.size(); d++) in.dim_order.push_back(static_cast<uint8_t>(d));
  in.strides.assign(in.sizes.size(), 1);
  for (size_t d = in.sizes.size(); d-- > 1;) in.strides[d - 1] = in.strides[d] * in.sizes[d];
  in.data.assign(input_meta->nbytes(), 0);
  in.impl = std::make_unique<TensorImpl>(in.type, static_cast<ssize_t>(in.sizes.size()),
                                         in.sizes.data(), in.data.data(), in.dim_order.data(),
                                         in.strides.data());

  Workload workload;
  std::vector<int64_t> kv_lengths;  // decode: one execute per entry
  std::vector<std::pair<float, int64_t>> topk_reference;
  int executes_per_round;
  if (in.type == ScalarType::Float) {
    workload = Workload::TopK;
    const size_t n = in.data.size() / sizeof(float);
    auto* x = reinterpret_cast<float*>(in.data.data());
    // Distinct logits, a permutation of a grid: the top-k is unambiguous.
    for (size_t i = 0; i < n; i++) {
      x[i] = (static_cast<float>((i * 7919) % n) - static_cast<float>(n / 2)) / 1024.0f;
    }
    for (size_t i = 0; i < n; i++) topk_reference.emplace_back(x[i], static_cast<int64_t>(i));
    std::partial_sort(topk_reference.begin(), topk_reference.begin() + kTopK,
                      topk_reference.end(), [](auto& a, auto& b) { return a.first > b.first; });
    topk_reference.resize(kTopK);
    executes_per_round = o.quick ? 5 : 20;
  } else if (in.type == ScalarType::Long && in.data.size() == sizeof(int64_t)) {
    workload = Workload::Decode;
    const int64_t stride = o.quick ? 40 : 8;
    for (int64_t kv = 1; kv <= kDecodeMaxKv; kv += stride) kv_lengths.push_back(kv);
    executes_per_round = static_cast<int>(kv_lengths.size());
  } else {
    std::fprintf(stderr, "executorch_programs: %s: input 0 is neither float (top-k) nor an "
                         "int64 [1] KV length (decode)\n", o.program.c_str());
    return 2;
  }

  // Planned memory, sized by the program.
  std::vector<std::vector<uint8_t>> planned_buffers;
  std::vector<Span<uint8_t>> planned_spans;
  for (size_t i = 0; i < meta->num_memory_planned_buffers(); i++) {
    planned_buffers.emplace_back(static_cast<size_t>(meta->memory_planned_buffer_size(i).get()));
  }
  for (auto& b : planned_buffers) planned_spans.emplace_back(b.data(), b.size());
  HierarchicalAllocator planned({planned_spans.data(), planned_spans.size()});
  std::vector<uint8_t> method_pool(1 << 20);
  MemoryAllocator method_allocator(static_cast<uint32_t>(method_pool.size()), method_pool.data());

  TempAllocator temp;
  if (!make_temp_allocator(o, temp)) return 1;
  MemoryManager memory(&method_allocator, &planned, temp.counting.get());
  auto method = program->load_method("forward", &memory);
  if (!method.ok()) {
    std::fprintf(stderr, "executorch_programs: %s: load_method(\"forward\"): %s\n",
                 o.program.c_str(), executorch::runtime::to_string(method.error()));
    return 2;
  }

  bool correct = true;
  Error failure = Error::Ok;
  // One round: every execute of the workload; returns the hash of all outputs.
  auto round = [&]() -> uint64_t {
    uint64_t h = 14695981039346656037ull;
    for (int e = 0; e < executes_per_round && failure == Error::Ok; e++) {
      if (workload == Workload::Decode) {
        std::memcpy(in.data.data(), &kv_lengths[e], sizeof(int64_t));
      }
      Error err = method->set_input(EValue(Tensor(in.impl.get())), 0);
      if (err == Error::Ok) err = method->execute();
      if (err != Error::Ok) {
        failure = err;
        break;
      }
      for (size_t i = 0; i < method->outputs_size(); i++) {
        const Tensor& t = method->get_output(i).toTensor();
        fnv(h, t.const_data_ptr(), t.nbytes());
      }
      if (workload == Workload::TopK) {
        const float* values = method->get_output(0).toTensor().const_data_ptr<float>();
        const int64_t* indices = method->get_output(1).toTensor().const_data_ptr<int64_t>();
        for (int64_t k = 0; k < kTopK; k++) {
          correct &= values[k] == topk_reference[k].first && indices[k] == topk_reference[k].second;
        }
      }
    }
    return h;
  };

  auto* caching = dynamic_cast<caching_allocator::ExecuTorchTempAllocator*>(temp.inner.get());
  if (!o.plan.empty()) temp.counting->watch_interval_peaks(caching);
  if (!o.plan.empty() && !caching->start_temp_plan(kPlanCapacity)) {
    std::fprintf(stderr, "executorch_programs: start_temp_plan: %s\n", caching->last_error().message);
    return 1;
  }
  const uint64_t warm_heap0 = heap_count::calls();
  const uint64_t warm_hash = round();  // warm-up: not measured
  const uint64_t warmup_heap_calls = heap_count::calls() - warm_heap0;
  size_t plan_max = 0;
  if (!o.plan.empty()) {
    caching->stop_temp_plan();
    int64_t formula = -1;
    if (workload == Workload::Decode) {
      // sdpa_decode.pte's threads and head_dim (scripts/executorch-pte.py), at the largest KV.
      const auto s = ca_example::sdpa_decode_scratch_bytes(kv_lengths.back(), 8, 64);
      formula = static_cast<int64_t>(s.accum_bytes + s.dequant_bytes);
    }
    temp.counting->watch_interval_peaks(nullptr);
    plan_max = write_temp_plan(o, *caching, executes_per_round, formula,
                               temp.counting->stats_max_interval_peak());
    if (plan_max == 0) return 1;
  }
  std::vector<double> ns_per_execute;
  ns_per_execute.reserve(static_cast<size_t>(o.rounds));  // no heap call while counting
  bool hashes_agree = true;
  const uint64_t heap0 = heap_count::calls();
  const uint64_t faults0 = minor_faults();
  for (int r = 0; r < o.rounds && failure == Error::Ok; r++) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t h = round();
    const auto t1 = std::chrono::steady_clock::now();
    hashes_agree &= h == warm_hash;
    ns_per_execute.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() /
                             executes_per_round);
  }
  const uint64_t heap_calls = heap_count::calls() - heap0;
  const uint64_t faults = minor_faults() - faults0;
  if (failure != Error::Ok) {
    std::fprintf(stderr, "executorch_programs: %s with temp allocator %s: execute failed: %s "
                         "(%" PRIu64 " failed allocate_temp calls)\n",
                 o.program.c_str(), o.allocator.c_str(), executorch::runtime::to_string(failure),
                 temp.counting->failed());
    return 1;
  }
  const double executes = static_cast<double>(o.rounds) * executes_per_round;
  std::vector<double> sorted = ns_per_execute;
  std::sort(sorted.begin(), sorted.end());
  std::string name = o.program.substr(o.program.find_last_of('/') + 1);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, ".pte") == 0) name.resize(name.size() - 4);
  std::printf(
      "{\"program\": \"%s\", \"allocator\": \"%s\", \"outputs_hash\": \"%016" PRIx64 "\", "
      "\"outputs_correct\": %s, \"rounds\": %d, \"executes_per_round\": %d, "
      "\"heap_calls_per_execute\": %.3f, \"page_faults_per_execute\": %.3f, "
      "\"time_per_execute_ns\": {\"median\": %.0f, \"min\": %.0f, \"max\": %.0f}, "
      "\"temp_peak_bytes\": %zu, \"temp_calls_per_execute\": %.3f, "
      "\"failed_allocate_temp\": %" PRIu64 ", \"plan_max_bytes\": %zu, "
      "\"warmup_heap_calls\": %" PRIu64 "}\n",
      name.c_str(), o.allocator.c_str(), warm_hash, (correct && hashes_agree) ? "true" : "false",
      o.rounds, executes_per_round, heap_calls / executes, faults / executes,
      sorted[sorted.size() / 2], sorted.front(), sorted.back(),
      temp.counting->peak_interval_bytes(),
      static_cast<double>(temp.counting->calls()) / (executes + executes_per_round),
      temp.counting->failed(), plan_max, warmup_heap_calls);
  return correct && hashes_agree ? 0 : 1;
}
