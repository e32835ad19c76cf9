// The autotuner: compile pool (CPU threads), device bench (inputs, output check, timing), search.
#include "tune/tuner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "codegen/chain_info.h"
#include "codegen/planner.h"
#include "fmt/format.h"
#include "fusejit/reference.h"
#include "jit/device.h"
#include "jit/driver.h"
#include "jit/module.h"
#include "jit/nvrtc.h"
#include "templates/embedded.h"

namespace fusejit::tune {
namespace {

using Clock = std::chrono::steady_clock;
using CompileResult = absl::StatusOr<std::shared_ptr<CompiledChain>>;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- compiling on CPU threads ---------------------------------------------------------------

// Runs compile(index) for submitted indices on `threads` threads; results are taken in the order
// they finish. Destruction drops what has not started and waits for compiles in flight.
class CompilePool {
 public:
  CompilePool(int threads, std::function<CompileResult(size_t)> compile)
      : compile_(std::move(compile)) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~CompilePool() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      queue_.clear();
    }
    wake_.SignalAll();
    for (std::thread& t : workers_) t.join();
  }
  CompilePool(const CompilePool&) = delete;
  CompilePool& operator=(const CompilePool&) = delete;

  void Submit(size_t index) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(index);
    ++pending_;
    wake_.Signal();
  }
  // Submitted and not yet returned by Next().
  size_t pending() {
    absl::MutexLock lock(&mu_);
    return pending_;
  }
  // The next finished compile: false when nothing is pending or at `deadline`.
  bool Next(absl::Time deadline, size_t* index, CompileResult* result) {
    absl::MutexLock lock(&mu_);
    while (pending_ > 0 && done_.empty()) {
      if (finished_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
    }
    if (done_.empty()) return false;
    *index = done_.front().first;
    *result = std::move(done_.front().second);
    done_.pop_front();
    --pending_;
    return true;
  }
  // Forgets submitted compiles that have not started.
  void DropQueued() {
    absl::MutexLock lock(&mu_);
    pending_ -= queue_.size();
    queue_.clear();
  }

 private:
  void Work() {
    while (true) {
      size_t index = 0;
      {
        absl::MutexLock lock(&mu_);
        while (!stop_ && queue_.empty()) wake_.Wait(&mu_);
        if (stop_) return;
        index = queue_.front();
        queue_.pop_front();
      }
      CompileResult result = compile_(index);
      absl::MutexLock lock(&mu_);
      done_.emplace_back(index, std::move(result));
      finished_.Signal();
    }
  }

  const std::function<CompileResult(size_t)> compile_;
  std::vector<std::thread> workers_;
  absl::Mutex mu_;
  absl::CondVar wake_, finished_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<size_t> queue_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<size_t, CompileResult>> done_ ABSL_GUARDED_BY(mu_);
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
};

// ---- the device side ------------------------------------------------------------------------

class ScopedStream {
 public:
  explicit ScopedStream(const jit::DriverApi* api) : api_(api) {}
  ~ScopedStream() {
    if (stream_ != nullptr) (void)api_->cuStreamDestroy(stream_);  // nothing to report to
  }
  absl::Status Create() {
    FUSEJIT_CU_RETURN_IF_ERROR(api_->cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING),
                               "cuStreamCreate");
    return absl::OkStatus();
  }
  CUstream get() const { return stream_; }

 private:
  const jit::DriverApi* api_;
  CUstream stream_ = nullptr;
};

struct Comparison {
  double rel_l2 = 0;
  int64_t non_finite = 0;
};

// Inputs on the device, the output and the default configuration's output, the workspace, the
// L2 flush buffer, a stream and the comparison kernel. One per TuneChain call.
class Bench {
 public:
  Bench(const jit::DriverApi* api, const TuneOptions& options)
      : api_(api), options_(options), stream_(api) {}

  absl::Status Init(const Chain& chain, const HostInputs& inputs, const std::string& arch,
                    int sm_count) {
    if (absl::Status s = stream_.Create(); !s.ok()) return s;
    dtype_ = chain.dtype;
    absl::StatusOr<jit::DeviceBuffer> x = Upload(inputs.x);
    if (!x.ok()) return x.status();
    x_ = *std::move(x);
    for (const ParamSpec& p : ChainParams(chain)) {
      auto it = inputs.params.find(p.name);
      if (it == inputs.params.end()) return absl::InternalError("missing input " + p.name);
      absl::StatusOr<jit::DeviceBuffer> buf = Upload(it->second);
      if (!buf.ok()) return buf.status();
      params_.emplace(p.name, *std::move(buf));
    }
    outputs_ = NumElements(OutputShape(chain));
    for (jit::DeviceBuffer* b : {&y_, &reference_}) {
      absl::StatusOr<jit::DeviceBuffer> buf = jit::DeviceBuffer::Allocate(OutputBytes());
      if (!buf.ok()) return buf.status();
      *b = *std::move(buf);
    }
    absl::StatusOr<jit::DeviceBuffer> flush = jit::DeviceBuffer::Allocate(options_.l2_flush_bytes);
    if (!flush.ok()) return flush.status();
    flush_ = *std::move(flush);
    compare_blocks_ = static_cast<unsigned>(
        std::clamp<int64_t>((outputs_ + 255) / 256, 1, int64_t{sm_count} * 4));
    absl::StatusOr<jit::DeviceBuffer> partials =
        jit::DeviceBuffer::Allocate(size_t{compare_blocks_} * 3 * sizeof(double));
    if (!partials.ok()) return partials.status();
    partials_ = *std::move(partials);
    return LoadCompare(arch);
  }

  // Runs `c` once into the NaN-poisoned output (all-ones bytes: a NaN in every dtype) and waits
  // for it.
  absl::Status RunOnce(CompiledChain& c) {
    if (absl::Status s = c.Load(); !s.ok()) return s;
    absl::StatusOr<Bindings> b = BindingsFor(c);
    if (!b.ok()) return b.status();
    FUSEJIT_CU_RETURN_IF_ERROR(api_->cuMemsetD8Async(y_.ptr(), 0xFF, OutputBytes(), stream_.get()),
                               "poisoning y");
    if (absl::Status s = c.Run(*b, stream_.get()); !s.ok()) return s;
    FUSEJIT_CU_RETURN_IF_ERROR(api_->cuStreamSynchronize(stream_.get()), "running the chain");
    return absl::OkStatus();
  }

  // Elements [offset, offset + count) of the last output, as floats.
  absl::StatusOr<std::vector<float>> Download(int64_t offset, int64_t count) {
    const size_t elem = DTypeBytes(dtype_);
    std::vector<char> raw(static_cast<size_t>(count) * elem);
    FUSEJIT_CU_RETURN_IF_ERROR(
        api_->cuMemcpyDtoH(raw.data(), y_.ptr() + static_cast<CUdeviceptr>(offset) * elem,
                           raw.size()),
        "copying the output to the host");
    std::vector<float> host(static_cast<size_t>(count));
    DecodeDType(raw.data(), host.size(), dtype_, host.data());
    return host;
  }

  absl::Status KeepAsReference() {
    FUSEJIT_CU_RETURN_IF_ERROR(
        api_->cuMemcpyDtoDAsync(reference_.ptr(), y_.ptr(), OutputBytes(), stream_.get()),
        "copying the reference output");
    FUSEJIT_CU_RETURN_IF_ERROR(api_->cuStreamSynchronize(stream_.get()), "cuStreamSynchronize");
    return absl::OkStatus();
  }

  // The last output against the reference.
  absl::StatusOr<Comparison> Compare() {
    CUdeviceptr a = y_.ptr(), b = reference_.ptr(), p = partials_.ptr();
    long long n = outputs_;
    void* args[] = {&a, &b, &n, &p};
    if (absl::Status s = jit::Launch(compare_, {compare_blocks_, 1, 1}, {256, 1, 1}, 0,
                                     stream_.get(), args);
        !s.ok()) {
      return s;
    }
    std::vector<double> host(size_t{compare_blocks_} * 3);
    FUSEJIT_CU_RETURN_IF_ERROR(api_->cuStreamSynchronize(stream_.get()), "comparing outputs");
    if (absl::Status s = partials_.CopyToHost(host.data(), host.size() * sizeof(double));
        !s.ok()) {
      return s;
    }
    double d2 = 0, b2 = 0, bad = 0;
    for (unsigned i = 0; i < compare_blocks_; ++i) {
      d2 += host[3 * i];
      b2 += host[3 * i + 1];
      bad += host[3 * i + 2];
    }
    Comparison c;
    c.non_finite = static_cast<int64_t>(bad);
    c.rel_l2 = b2 > 0 ? std::sqrt(d2 / b2) : (d2 > 0 ? std::numeric_limits<double>::infinity() : 0);
    return c;
  }

  // Median of `reps` L2-flushed runs (or every sample, when `samples` is given).
  absl::StatusOr<double> Time(CompiledChain& c, int warmup, int reps,
                              std::vector<float>* samples = nullptr) {
    absl::StatusOr<Bindings> b = BindingsFor(c);
    if (!b.ok()) return b.status();
    const std::function<absl::Status()> flush = [this]() -> absl::Status {
      FUSEJIT_CU_RETURN_IF_ERROR(api_->cuMemsetD32Async(flush_.ptr(), 0x3f800000u,
                                                        flush_.bytes() / 4, stream_.get()),
                                 "flushing the L2 cache");
      return absl::OkStatus();
    };
    absl::StatusOr<std::vector<float>> times = jit::EventTimer::Time(
        stream_.get(), warmup, reps, [&] { return c.Run(*b, stream_.get()); },
        options_.l2_flush_bytes > 0 ? flush : nullptr);
    if (!times.ok()) return times.status();
    if (samples != nullptr) samples->insert(samples->end(), times->begin(), times->end());
    return jit::Median(*std::move(times));
  }

  // Whether the context still works (a kernel fault makes every later call fail).
  absl::Status Healthy() {
    FUSEJIT_CU_RETURN_IF_ERROR(api_->cuCtxSynchronize(), "cuCtxSynchronize");
    return absl::OkStatus();
  }

 private:
  size_t OutputBytes() const { return static_cast<size_t>(outputs_) * DTypeBytes(dtype_); }

  // A tensor in the chain's dtype (RandomInputs' values are already rounded to it).
  absl::StatusOr<jit::DeviceBuffer> Upload(const HostTensor& t) {
    std::vector<char> host(t.data.size() * DTypeBytes(dtype_));
    EncodeDType(t.data.data(), t.data.size(), dtype_, host.data());
    absl::StatusOr<jit::DeviceBuffer> buf = jit::DeviceBuffer::Allocate(host.size());
    if (!buf.ok()) return buf.status();
    if (absl::Status s = buf->CopyFromHost(host.data(), host.size()); !s.ok()) return s;
    return buf;
  }

  absl::StatusOr<Bindings> BindingsFor(const CompiledChain& c) {
    if (c.workspace_bytes() > workspace_.bytes()) {
      workspace_ = jit::DeviceBuffer();  // free first
      absl::StatusOr<jit::DeviceBuffer> ws = jit::DeviceBuffer::Allocate(c.workspace_bytes());
      if (!ws.ok()) return ws.status();
      workspace_ = *std::move(ws);
    }
    Bindings b;
    b.input = x_.ptr();
    b.output = y_.ptr();
    b.workspace = workspace_.ptr();
    for (const auto& [name, buf] : params_) b.params[name] = buf.ptr();
    return b;
  }

  absl::Status LoadCompare(const std::string& arch) {
    const templates::TemplateFile* file = templates::Find("tune_compare.cuh");
    if (file == nullptr) return absl::InternalError("templates/tune_compare.cuh is not embedded");
    jit::NvrtcRequest request;
    request.name = "tune_compare.cu";
    request.source = std::string(file->text);
    request.arch = arch;
    const templates::TemplateFile* dtype = templates::Find("dtype.cuh");
    if (dtype == nullptr) return absl::InternalError("templates/dtype.cuh is not embedded");
    request.headers.emplace_back(std::string(dtype->name), std::string(dtype->text));
    absl::StatusOr<jit::NvrtcResult> out = jit::CompileCuda(request);
    if (!out.ok()) return out.status();
    absl::StatusOr<std::unique_ptr<jit::LoadedModule>> module = jit::LoadedModule::Load(out->cubin);
    if (!module.ok()) return module.status();
    compare_module_ = *std::move(module);
    absl::StatusOr<CUfunction> f =
        compare_module_->Function(std::string("fj_tune_compare_") + std::string(DTypeName(dtype_)));
    if (!f.ok()) return f.status();
    compare_ = *f;
    return absl::OkStatus();
  }

  const jit::DriverApi* api_;
  const TuneOptions& options_;
  ScopedStream stream_;
  jit::DeviceBuffer x_, y_, reference_, workspace_, flush_, partials_;
  std::map<std::string, jit::DeviceBuffer> params_;
  int64_t outputs_ = 0;
  DType dtype_ = DType::kF32;
  unsigned compare_blocks_ = 1;
  std::unique_ptr<jit::LoadedModule> compare_module_;
  CUfunction compare_ = nullptr;
};

// ---- the search -----------------------------------------------------------------------------

// The tolerance before calibration: the one given, at least the unit roundoff of a 16-bit output
// dtype (two correct plans round fp32 values that differ in their last bits to neighbouring bf16
// or f16 values: a few outputs one unit apart; a wrong one is off by O(1)).
double BaseTolerance(DType dtype, double given) {
  if (dtype == DType::kBF16) return std::max(given, 0x1p-8);
  if (dtype == DType::kF16) return std::max(given, 0x1p-11);
  return given;
}

class Search {
 public:
  Search(const Chain& chain, const HostInputs& inputs, std::vector<codegen::TuneConfig> space,
         Bench& bench, CompilePool& pool, const TuneOptions& options, TuneResult& result)
      : chain_(chain),
        inputs_(inputs),
        space_(std::move(space)),
        bench_(bench),
        pool_(pool),
        options_(options),
        result_(result),
        tried_(space_.size(), false),
        tolerance_(BaseTolerance(chain.dtype, options.tolerance)) {
    for (size_t i = 0; i < space_.size(); ++i) default_of_.try_emplace(space_[i].strategy, i);
  }

  // Step 1: the default, synchronously. Its failure fails the tuning.
  absl::Status MeasureDefault() {
    tried_[0] = true;
    pool_.Submit(0);
    size_t index = 0;
    CompileResult compiled;
    if (!pool_.Next(absl::InfiniteFuture(), &index, &compiled)) {
      return absl::InternalError("the default configuration was not compiled");
    }
    if (!compiled.ok()) return compiled.status();
    default_ = *std::move(compiled);
    CandidateResult r;
    r.config = space_[0].ToString();
    if (absl::Status s = bench_.RunOnce(*default_); !s.ok()) return s;
    if (absl::Status s = bench_.KeepAsReference(); !s.ok()) return s;
    absl::StatusOr<Comparison> c = bench_.Compare();  // counts unwritten (NaN) outputs
    if (!c.ok()) return c.status();
    if (c->non_finite > 0) {
      return absl::InternalError(fmt::format("the default configuration {} leaves {} outputs "
                                             "non-finite",
                                             r.config, c->non_finite));
    }
    if (absl::Status s = CalibrateTolerance(); !s.ok()) return s;
    absl::StatusOr<double> t = bench_.Time(*default_, options_.warmup, options_.reps);
    if (!t.ok()) return t.status();
    r.median_ms = *t;
    best_ = 0;
    best_ms_ = *t;
    Record(std::move(r));
    return absl::OkStatus();
  }

  // Steps 2 and 3, until the space, the budget or the candidate limit runs out.
  absl::Status Explore(absl::Time deadline) {
    deadline_ = deadline;
    while (!exhausted_) {
      const size_t before = best_;
      std::vector<size_t> frontier;
      for (size_t j = 0; j < space_.size(); ++j) {
        if (!tried_[j] && IsNeighbour(best_, j)) frontier.push_back(j);
      }
      if (frontier.empty()) break;
      if (absl::Status s = RunBatch(frontier); !s.ok()) return s;
      if (best_ == before) break;  // a local optimum
    }
    if (exhausted_) return absl::OkStatus();
    std::vector<size_t> rest;
    for (size_t j = 0; j < space_.size(); ++j) {
      if (!tried_[j]) rest.push_back(j);
    }
    std::stable_sort(rest.begin(), rest.end(), [&](size_t a, size_t b) {
      return space_[a].Distance(space_[best_]) < space_[b].Distance(space_[best_]);
    });
    return RunBatch(rest);
  }

  // Step 4: the default and the fastest finalists again, interleaved; returns the winner's index
  // in `finalists_` order (0: the default).
  absl::Status Confirm() {
    std::vector<std::pair<size_t, std::shared_ptr<CompiledChain>>> runs = {{0, default_}};
    for (const auto& f : finalists_) runs.push_back({f.index, f.compiled});
    std::vector<std::vector<float>> samples(runs.size());
    for (int round = 0; round < std::max(1, options_.confirm_rounds); ++round) {
      for (size_t i = 0; i < runs.size(); ++i) {
        absl::StatusOr<double> t = bench_.Time(*runs[i].second, 1, options_.reps, &samples[i]);
        if (!t.ok()) return t.status();
      }
    }
    size_t winner = 0;
    std::vector<double> medians;
    for (size_t i = 0; i < runs.size(); ++i) {
      medians.push_back(jit::Median(samples[i]));
      if (medians[i] < medians[winner]) winner = i;
    }
    result_.default_config = space_[0].ToString();
    result_.default_ms = medians[0];
    result_.best_config = space_[runs[winner].first].ToString();
    result_.best_ms = medians[winner];
    return absl::OkStatus();
  }

  bool exhausted() const { return exhausted_; }

 private:
  // tolerance_ = max(tolerance, error_factor x the default's error against float64 on the first
  // and last sample), when that reference is affordable.
  absl::Status CalibrateTolerance() {
    result_.tolerance = tolerance_;
    const Shape out = OutputShape(chain_);
    const int64_t n = out[0], per_sample = NumElements(out) / std::max<int64_t>(1, n);
    std::vector<int64_t> samples = {0};
    if (n > 1) samples.push_back(n - 1);
    const codegen::ChainInfo info = codegen::AnalyzeChain(chain_);
    const double macs = info.macs_per_point * static_cast<double>(info.elements) /
                        static_cast<double>(std::max<int64_t>(1, n)) *
                        static_cast<double>(samples.size());
    if (macs > options_.reference_max_macs) return absl::OkStatus();
    std::vector<float> got;
    for (int64_t s : samples) {
      absl::StatusOr<std::vector<float>> row = bench_.Download(s * per_sample, per_sample);
      if (!row.ok()) return row.status();
      got.insert(got.end(), row->begin(), row->end());
    }
    ReferenceOptions ro;
    ro.samples = samples;
    absl::StatusOr<std::vector<double>> ref = RunReference(chain_, inputs_, ro);
    if (!ref.ok()) return ref.status();
    if (ref->size() != got.size()) return absl::InternalError("reference size mismatch");
    const ErrorStats e =
        CompareToReference(got.data(), ref->data(), static_cast<int64_t>(got.size()));
    result_.default_error = e.rel_l2;
    if (std::isfinite(e.rel_l2)) {
      tolerance_ = std::max(BaseTolerance(chain_.dtype, options_.tolerance),
                            options_.error_factor * e.rel_l2);
    }
    result_.tolerance = tolerance_;
    return absl::OkStatus();
  }

  struct Finalist {
    double ms;
    size_t index;
    std::shared_ptr<CompiledChain> compiled;
  };

  // j is one parameter away from i, or the default of another strategy.
  bool IsNeighbour(size_t i, size_t j) const {
    if (space_[i].strategy != space_[j].strategy) return default_of_.at(space_[j].strategy) == j;
    return space_[i].Distance(space_[j]) == 1;
  }

  bool LimitReached() const {
    return options_.max_candidates > 0 &&
           result_.tried + submitted_ >= static_cast<size_t>(options_.max_candidates);
  }

  absl::Status RunBatch(const std::vector<size_t>& batch) {
    size_t next = 0;
    // Keep the compile threads busy without queueing far ahead (so that a stop wastes little).
    const size_t ahead = std::max<size_t>(2, 2 * std::thread::hardware_concurrency());
    auto refill = [&] {
      while (next < batch.size() && submitted_ < ahead && !LimitReached()) {
        tried_[batch[next]] = true;
        pool_.Submit(batch[next++]);
        ++submitted_;
      }
    };
    refill();
    while (submitted_ > 0) {
      size_t index = 0;
      CompileResult compiled;
      if (!pool_.Next(deadline_, &index, &compiled)) {  // out of time
        pool_.DropQueued();
        exhausted_ = true;
        return absl::OkStatus();
      }
      --submitted_;
      if (absl::Status s = Measure(index, std::move(compiled)); !s.ok()) return s;
      if (absl::Now() >= deadline_) {
        pool_.DropQueued();
        exhausted_ = true;
        return absl::OkStatus();
      }
      refill();
    }
    if (next < batch.size()) exhausted_ = true;  // the candidate limit
    return absl::OkStatus();
  }

  absl::Status Measure(size_t index, CompileResult compiled) {
    CandidateResult r;
    r.config = space_[index].ToString();
    if (!compiled.ok()) {
      r.outcome = CandidateResult::Outcome::kCompileError;
      r.error = std::string(compiled.status().message());
      Record(std::move(r));
      return absl::OkStatus();
    }
    CompiledChain& c = **compiled;
    absl::Status run = bench_.RunOnce(c);
    absl::StatusOr<Comparison> cmp = run.ok() ? bench_.Compare() : absl::StatusOr<Comparison>(run);
    absl::StatusOr<double> t = absl::InternalError("not timed");
    if (cmp.ok()) {
      r.rel_l2 = cmp->rel_l2;
      r.non_finite = cmp->non_finite;
      if (cmp->non_finite > 0 || !(cmp->rel_l2 <= tolerance_)) {
        r.outcome = CandidateResult::Outcome::kMismatch;
        Record(std::move(r));
        return absl::OkStatus();
      }
      // Screening: 3 runs; a clear loser is not timed further.
      t = bench_.Time(c, 1, 3);
      if (t.ok() && *t > options_.screen_factor * best_ms_) {
        r.median_ms = *t;
        r.screened = true;
        Record(std::move(r));
        return absl::OkStatus();
      }
      if (t.ok()) t = bench_.Time(c, options_.warmup, options_.reps);
    }
    if (!cmp.ok() || !t.ok()) {
      r.outcome = CandidateResult::Outcome::kRunError;
      r.error = std::string((cmp.ok() ? t.status() : cmp.status()).message());
      Record(std::move(r));
      if (absl::Status h = bench_.Healthy(); !h.ok()) {
        return absl::Status(h.code(), fmt::format("the device context failed after candidate {}: "
                                                  "{}",
                                                  space_[index].ToString(),
                                                  std::string(h.message())));
      }
      return absl::OkStatus();
    }
    r.median_ms = *t;
    if (*t < best_ms_) {
      best_ms_ = *t;
      best_ = index;
    }
    finalists_.push_back({*t, index, *std::move(compiled)});
    std::sort(finalists_.begin(), finalists_.end(),
              [](const Finalist& a, const Finalist& b) { return a.ms < b.ms; });
    if (finalists_.size() > static_cast<size_t>(std::max(0, options_.confirm_finalists))) {
      finalists_.pop_back();
    }
    Record(std::move(r));
    return absl::OkStatus();
  }

  void Record(CandidateResult r) {
    ++result_.tried;
    if (r.outcome == CandidateResult::Outcome::kMismatch) ++result_.rejected;
    if (r.outcome == CandidateResult::Outcome::kCompileError ||
        r.outcome == CandidateResult::Outcome::kRunError) {
      ++result_.failed;
    }
    if (options_.on_candidate) options_.on_candidate(r);
    result_.candidates.push_back(std::move(r));
  }

  const Chain& chain_;
  const HostInputs& inputs_;
  const std::vector<codegen::TuneConfig> space_;
  Bench& bench_;
  CompilePool& pool_;
  const TuneOptions& options_;
  TuneResult& result_;
  std::vector<bool> tried_;  // measured or submitted
  absl::flat_hash_map<std::string, size_t> default_of_;  // strategy -> index of its default
  std::shared_ptr<CompiledChain> default_;
  std::vector<Finalist> finalists_;  // fastest first, at most confirm_finalists
  size_t best_ = 0;
  double best_ms_ = std::numeric_limits<double>::infinity();
  size_t submitted_ = 0;  // in the pool
  absl::Time deadline_ = absl::InfiniteFuture();
  bool exhausted_ = false;
  double tolerance_;
};

}  // namespace

std::string_view OutcomeName(CandidateResult::Outcome outcome) {
  switch (outcome) {
    case CandidateResult::Outcome::kTimed: return "timed";
    case CandidateResult::Outcome::kMismatch: return "mismatch";
    case CandidateResult::Outcome::kCompileError: return "compile-error";
    case CandidateResult::Outcome::kRunError: return "run-error";
  }
  return "?";
}

TuningRecord TuneResult::ToRecord() const {
  TuningRecord r;
  r.key = {spec, arch, precision, device};
  r.fusejit_version = GeneratorBuild();
  r.config = best_config;
  r.default_config = default_config;
  r.default_ms = default_ms;
  r.best_ms = best_ms;
  r.tried = static_cast<int>(tried);
  r.rejected = static_cast<int>(rejected);
  r.failed = static_cast<int>(failed);
  r.tuning_s = seconds;
  r.tuned_at = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  return r;
}

absl::StatusOr<TuneResult> TuneChain(const Chain& chain, const TuneOptions& options) {
  const Clock::time_point start = Clock::now();
  if (absl::Status s = ValidateChain(chain); !s.ok()) return s;
  absl::StatusOr<const jit::DriverApi*> api = jit::Driver();
  if (!api.ok()) return api.status();
  absl::StatusOr<jit::DeviceInfo> device = jit::CurrentDeviceInfo();
  if (!device.ok()) return device.status();

  TuneResult result;
  result.spec = FormatChain(chain);
  result.arch = device->arch;
  result.precision = options.precision;
  result.device = {device->name, device->sm_count, device->driver_version};
  codegen::PlanTarget target;
  target.arch = device->arch;
  target.sm_count = device->sm_count;
  target.precision = options.precision;
  std::vector<codegen::TuneConfig> space = codegen::AllCandidates(chain, target);
  if (space.empty()) return absl::InternalError("no configuration applies (a planner bug)");
  result.space = space.size();

  const HostInputs inputs = RandomInputs(chain, options.seed);
  Bench bench(*api, options);
  if (absl::Status s = bench.Init(chain, inputs, device->arch, device->sm_count); !s.ok()) {
    return s;
  }

  CompileOptions base;
  base.arch = device->arch;
  base.precision = options.precision;
  base.use_cache = false;  // candidates are not kept; the winner is compiled (and cached) on use
  base.use_tuning = false;
  base.tuning_device = result.device;
  const int threads = options.compile_threads > 0
                          ? options.compile_threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CompilePool pool(threads, [&](size_t index) -> CompileResult {
    CompileOptions o = base;
    o.tune_config = space[index].ToString();
    return Compile(chain, o);
  });
  Search search(chain, inputs, space, bench, pool, options, result);
  const absl::Time deadline = absl::Now() + absl::Seconds(options.budget_s);
  if (absl::Status s = search.MeasureDefault(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("tuning ", result.spec, ": the default "
                                               "configuration: ", s.message()));
  }
  if (absl::Status s = search.Explore(deadline); !s.ok()) return s;
  result.budget_exhausted = search.exhausted();
  if (absl::Status s = search.Confirm(); !s.ok()) return s;
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace fusejit::tune
