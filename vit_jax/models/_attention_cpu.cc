// Softmax attention for XLA:CPU, forward and backward, as XLA FFI custom calls (float32).
//
// Why: XLA:CPU gives the attention's batched matmuls (QK^T, PV and their gradients, one small product per batch
// element and head) to YNNPACK, which runs a batched dot on one thread: on 2 cores they run at 72-88 GFLOP/s while
// the model's 2-D matmuls run at ~200 (docs/BENCHMARKS.md, issue #17). Here each (batch, head) pair is one work item:
// the items are spread over XLA's own intra-op thread pool, and each item does its five small products and its
// softmax in cache, in one pass over its rows.
//
// Layout: q and o (B, H, T, D), k and v (B, H, S, D), and their gradients, row-major: the heads-first layout of
// layers._attention_heads_first. The forward pass also returns the probabilities p (B, H, T, S), which the backward
// pass reads instead of recomputing them (the same residual XLA's own autodiff keeps).
//
// The products run on one register-blocked kernel: C[M, N] = alpha * A[M, K] B[K, N] with A read through strides
// (so A or A^T) and B packed into panels of 32 (or 16) columns. Vector code is GCC's vector extensions, compiled for
// the building machine (-march=native in setup.py), so it is AVX-512 where the CPU has it and plain SSE/AVX otherwise.
#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <Python.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kLanes = 16;
typedef float vf __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));  // unaligned loads and stores
// Rows per register tile: 12 x 2 vectors = 24 accumulators of AVX-512's 32 registers; with 16 registers (AVX2, each
// vector two registers) 3 rows.
#if defined(__AVX512F__)
constexpr int kMaxRows = 12;
#else
constexpr int kMaxRows = 3;
#endif

// x - 0 is x for every float, so the compiler folds the subtraction away (x + 0 is not: -0 + 0 = +0).
inline vf splat(float x) { return x - vf{}; }

inline vf load(const float* x) { return *reinterpret_cast<const vf*>(x); }
inline void store(float* x, vf v) { *reinterpret_cast<vf*>(x) = v; }

// One tile: C[mr, ncols] = alpha * sum_k A[r, k] * Bp[k, :], Bp packed with `NV` vectors per k.
template <int MR, int NV>
void tile(int K, const float* a, int64_t sai, int64_t sak, const float* bp, float* c, int64_t ldc, int ncols,
          float alpha) {
  vf acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vf{};
  for (int k = 0; k < K; ++k) {
    vf b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load(bp + (int64_t)k * NV * kLanes + v * kLanes);
    const float* ak = a + k * sak;
    for (int r = 0; r < MR; ++r) {
      vf x = splat(ak[r * sai]);
      for (int v = 0; v < NV; ++v) acc[r][v] += x * b[v];
    }
  }
  vf s = splat(alpha);
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    if (ncols == NV * kLanes) {
      for (int v = 0; v < NV; ++v) store(cr + v * kLanes, acc[r][v] * s);
    } else {
      float tmp[NV * kLanes];
      for (int v = 0; v < NV; ++v) store(tmp + v * kLanes, acc[r][v] * s);
      std::memcpy(cr, tmp, ncols * sizeof(float));
    }
  }
}

using TileFn = void (*)(int, const float*, int64_t, int64_t, const float*, float*, int64_t, int, float);

template <int NV, int... R>
constexpr std::array<TileFn, sizeof...(R)> tile_table(std::integer_sequence<int, R...>) {
  return {&tile<R + 1, NV>...};
}
constexpr auto kTiles1 = tile_table<1>(std::make_integer_sequence<int, kMaxRows>{});
constexpr auto kTiles2 = tile_table<2>(std::make_integer_sequence<int, kMaxRows>{});

// Panels of B's columns: 32 wide, the last one 16 wide when at most 16 columns remain.
inline int panel_width(int n0, int N) { return N - n0 > kLanes ? 2 * kLanes : kLanes; }

inline int64_t packed_size(int K, int N) {
  return (int64_t)K * ((N + 2 * kLanes - 1) / (2 * kLanes) + 1) * 2 * kLanes;
}

// C[M, N] = alpha * A B, with A[i, k] = a[i * sai + k * sak] and B[k, n] = b[k * sbk + n * sbn]; `pack` holds
// packed_size(K, N) floats.
void gemm(int M, int N, int K, const float* a, int64_t sai, int64_t sak, const float* b, int64_t sbk, int64_t sbn,
          float* c, int64_t ldc, float alpha, float* pack) {
  float* panel = pack;
  for (int n0 = 0; n0 < N; n0 += panel_width(n0, N)) {
    const int w = panel_width(n0, N), cols = std::min(w, N - n0);
    for (int k = 0; k < K; ++k) {
      float* dst = panel + (int64_t)k * w;
      const float* src = b + k * sbk + n0 * sbn;
      if (sbn == 1) {
        std::memcpy(dst, src, cols * sizeof(float));
      } else {
        for (int j = 0; j < cols; ++j) dst[j] = src[j * sbn];
      }
      std::fill(dst + cols, dst + w, 0.0f);
    }
    const auto& tiles = w == kLanes ? kTiles1 : kTiles2;
    for (int i0 = 0; i0 < M; i0 += kMaxRows) {
      const int mr = std::min(kMaxRows, M - i0);
      tiles[mr - 1](K, a + i0 * sai, sai, sak, panel, c + i0 * ldc + n0, ldc, cols, alpha);
    }
    panel += (int64_t)K * w;
  }
}

// exp(x) for x <= 0 (softmax after the max is subtracted): 2^n * 2^f with f in [-0.5, 0.5], a degree-6 Taylor
// polynomial for 2^f (relative error < 2e-7); x below -87 (exp underflows float32) gives 0.
inline vf exp_nonpositive(vf x) {
  const vf log2e = splat(1.4426950408889634f);
  vf t = x * log2e;
  t = t < splat(-126.0f) ? splat(-126.0f) : t;
  // n = t rounded to the nearest integer: adding and subtracting 1.5 * 2^23 leaves no fraction bits (|t| <= 126).
  vf n = (t + splat(12582912.0f)) - splat(12582912.0f);
  vf f = (t - n) * splat(0.6931471805599453f);  // |f| <= ln(2) / 2
  vf p = splat(1.0f / 720);
  p = p * f + splat(1.0f / 120);
  p = p * f + splat(1.0f / 24);
  p = p * f + splat(1.0f / 6);
  p = p * f + splat(0.5f);
  p = p * f + splat(1.0f);
  p = p * f + splat(1.0f);
  typedef int vi __attribute__((vector_size(kLanes * 4)));
  vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  vf y = p * scale;
  return x < splat(-87.0f) ? vf{} : y;
}

inline float sum_lanes(vf x) {
  float total = 0.0f;
  for (int l = 0; l < kLanes; ++l) total += x[l];
  return total;
}

// Row-wise softmax of the logits s[T, ld] over their first S columns, written to out[T, S]; columns S..ld-1 of s
// are scratch.
void softmax_rows(float* s, int64_t T, int64_t S, int64_t ld, float* out) {
  const float neg = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < T; ++i) {
    float* row = s + i * ld;
    std::fill(row + S, row + ld, neg);
    vf m = splat(neg);
    for (int64_t j = 0; j < ld; j += kLanes) m = load(row + j) > m ? load(row + j) : m;
    float mx = neg;
    for (int l = 0; l < kLanes; ++l) mx = std::max(mx, m[l]);
    vf total{};
    for (int64_t j = 0; j < ld; j += kLanes) {
      vf e = exp_nonpositive(load(row + j) - splat(mx));
      store(row + j, e);
      total += e;
    }
    const float inv = 1.0f / sum_lanes(total);
    float* o = out + i * S;
    int64_t j = 0;
    for (; j + kLanes <= S; j += kLanes) store(o + j, load(row + j) * splat(inv));
    for (; j < S; ++j) o[j] = row[j] * inv;
  }
}

// The logits' gradient from the probabilities' in place, row by row: dS = P * (dP - rowsum(P * dP)).
void softmax_grad_rows(const float* p, float* ds, int64_t T, int64_t S, int64_t ld) {
  for (int64_t i = 0; i < T; ++i) {
    const float* pr = p + i * S;
    float* dr = ds + i * ld;
    vf acc{};
    int64_t j = 0;
    for (; j + kLanes <= S; j += kLanes) acc += load(pr + j) * load(dr + j);
    float dot = sum_lanes(acc);
    for (; j < S; ++j) dot += pr[j] * dr[j];
    for (j = 0; j + kLanes <= S; j += kLanes) store(dr + j, load(pr + j) * (load(dr + j) - splat(dot)));
    for (; j < S; ++j) dr[j] = pr[j] * (dr[j] - dot);
  }
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Runs fn(item, scratch) for item in [0, n) on the calling thread and up to pool.num_threads() - 1 pool threads.
// The caller waits for the items, not for the helpers: a helper the pool starts late finds no item left and only
// touches the shared state it co-owns, so the call never waits on a pool thread that is busy elsewhere.
template <typename Fn>
void parallel_items(ffi::ThreadPool& pool, int64_t n, int64_t scratch_floats, Fn fn) {
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto state = std::make_shared<State>();
  auto work = [state, n, scratch_floats, &fn]() {
    std::vector<float> scratch;
    for (int64_t i; (i = state->next.fetch_add(1)) < n;) {
      if (scratch.empty()) scratch.resize(scratch_floats);
      fn(i, scratch.data());
      if (state->done.fetch_add(1) + 1 == n) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->cv.notify_all();
      }
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), n) - 1;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule(decltype(work)(work));
  work();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == n; });
}

// The dimensions of every operand, from q (B, H, T, D) and k (B, H, S, D): T queries attend to S keys.
struct Dims {
  int64_t B, H, T, S, D;
};

ffi::Error expect(const ffi::Buffer<ffi::F32>& x, const char* name, std::initializer_list<int64_t> want) {
  auto d = x.dimensions();
  if (d.size() == want.size() && std::equal(want.begin(), want.end(), d.begin())) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string("vit_jax attention: ") + name +
                                     " does not match q (B, H, T, D) and k (B, H, S, D)");
}

ffi::Error dims_of(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& k, Dims* out) {
  auto dq = q.dimensions(), dk = k.dimensions();
  if (dq.size() != 4 || dk.size() != 4 || dk[0] != dq[0] || dk[1] != dq[1] || dk[3] != dq[3])
    return ffi::Error::InvalidArgument("vit_jax attention: q and k must be (B, H, T, D) and (B, H, S, D)");
  *out = Dims{dq[0], dq[1], dq[2], dk[2], dq[3]};
  return ffi::Error::Success();
}

// Per work item: the logits or their gradient (T rows padded to ld) and the packed right-hand operand.
int64_t scratch_floats(const Dims& n, int64_t ld) {
  return n.T * ld + std::max({packed_size(n.D, n.S), packed_size(n.S, n.D), packed_size(n.T, n.D)});
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                   ffi::ResultBuffer<ffi::F32> o, ffi::ResultBuffer<ffi::F32> p, float scale) {
  Dims n;
  if (auto err = dims_of(q, k, &n); err.failure()) return err;
  if (auto err = expect(v, "v", {n.B, n.H, n.S, n.D}); err.failure()) return err;
  const int64_t T = n.T, S = n.S, D = n.D, ld = round_up(S, kLanes);
  const float *qd = q.typed_data(), *kd = k.typed_data(), *vd = v.typed_data();
  float *od = o->typed_data(), *pd = p->typed_data();
  parallel_items(pool, n.B * n.H, scratch_floats(n, ld), [&](int64_t item, float* buf) {
    const float *qi = qd + item * T * D, *ki = kd + item * S * D, *vi = vd + item * S * D;
    float *s = buf, *pack = buf + T * ld, *prob = pd + item * T * S;
    gemm(T, S, D, qi, D, 1, ki, 1, D, s, ld, scale, pack);                    // S = scale Q K^T
    softmax_rows(s, T, S, ld, prob);
    gemm(T, D, S, prob, S, 1, vi, D, 1, od + item * T * D, D, 1.0f, pack);     // O = P V
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                    ffi::Buffer<ffi::F32> p, ffi::Buffer<ffi::F32> dout, ffi::ResultBuffer<ffi::F32> dq,
                    ffi::ResultBuffer<ffi::F32> dk, ffi::ResultBuffer<ffi::F32> dv, float scale) {
  Dims n;
  if (auto err = dims_of(q, k, &n); err.failure()) return err;
  if (auto err = expect(v, "v", {n.B, n.H, n.S, n.D}); err.failure()) return err;
  if (auto err = expect(p, "the probabilities", {n.B, n.H, n.T, n.S}); err.failure()) return err;
  if (auto err = expect(dout, "the output gradient", {n.B, n.H, n.T, n.D}); err.failure()) return err;
  const int64_t T = n.T, S = n.S, D = n.D, ld = round_up(S, kLanes);
  const float *qd = q.typed_data(), *kd = k.typed_data(), *vd = v.typed_data(), *pd = p.typed_data(),
              *gd = dout.typed_data();
  float *dqd = dq->typed_data(), *dkd = dk->typed_data(), *dvd = dv->typed_data();
  parallel_items(pool, n.B * n.H, scratch_floats(n, ld), [&](int64_t item, float* buf) {
    const float *qi = qd + item * T * D, *ki = kd + item * S * D, *vi = vd + item * S * D, *gi = gd + item * T * D;
    const float* prob = pd + item * T * S;
    float *ds = buf, *pack = buf + T * ld;
    gemm(T, S, D, gi, D, 1, vi, 1, D, ds, ld, 1.0f, pack);                     // dP = dO V^T
    softmax_grad_rows(prob, ds, T, S, ld);
    gemm(S, D, T, prob, 1, S, gi, D, 1, dvd + item * S * D, D, 1.0f, pack);    // dV = P^T dO
    gemm(T, D, S, ds, ld, 1, ki, D, 1, dqd + item * T * D, D, scale, pack);    // dQ = scale dS K
    gemm(S, D, T, ds, 1, ld, qi, D, 1, dkd + item * S * D, D, scale, pack);    // dK = scale dS^T Q
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionForward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(VitJaxAttentionBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));

// The Python module only hands the two handlers to jax.ffi.register_ffi_target, as capsules.
static PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_attention_cpu", nullptr, -1, nullptr};

// -march=native: refuse to load on a CPU without the vector instructions the build used (a package built elsewhere).
static const char* missing_cpu_feature() {
#if defined(__x86_64__)
  __builtin_cpu_init();
#if defined(__AVX512F__)
  if (!__builtin_cpu_supports("avx512f")) return "avx512f";
#endif
#if defined(__AVX2__)
  if (!__builtin_cpu_supports("avx2")) return "avx2";
#endif
#if defined(__FMA__)
  if (!__builtin_cpu_supports("fma")) return "fma";
#endif
#endif
  return nullptr;
}

PyMODINIT_FUNC PyInit__attention_cpu() {
  if (const char* feature = missing_cpu_feature()) {
    PyErr_Format(PyExc_ImportError, "built for a CPU with %s, which this one lacks: reinstall vit_jax here", feature);
    return nullptr;
  }
  PyObject* m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  PyObject* fwd = PyCapsule_New(reinterpret_cast<void*>(&VitJaxAttentionForward), nullptr, nullptr);
  PyObject* bwd = PyCapsule_New(reinterpret_cast<void*>(&VitJaxAttentionBackward), nullptr, nullptr);
  if (PyModule_AddObject(m, "forward", fwd) < 0 || PyModule_AddObject(m, "backward", bwd) < 0) {
    Py_XDECREF(fwd);
    Py_XDECREF(bwd);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
