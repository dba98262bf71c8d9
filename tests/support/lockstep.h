// Lockstep execution of a GPU kernel's work-items on the CPU, for kernels whose lanes talk to each other (warp
// shuffles, DPP): every work-item of a block runs on its own std::thread, and a cross-lane read is an
// exchange: each lane publishes its value, all meet at a barrier, each reads its source lane's value, all meet
// again before the slots are reused. Shared by tests/support/hip_emul/hip_emul.h (DPP, wave64) and
// tests/support/cuda_emul/cuda_emul.h (__shfl_xor_sync, warp32).
//
// Divergence is recorded (errors, first_error) instead of being given a value, as far as it can be seen from
// here: a lane whose source lane did not make the same exchange (the same count of exchanges so far, from the
// same call site: file, line and column of the shuffle / DPP call), because it skipped one, took another
// branch or has returned; and lanes of one warp/wave that disagree on the pattern. Two paths into the same
// inlined helper share its call site, so divergence between them is not seen.
#pragma once

#include <atomic>
#include <barrier>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <source_location>
#include <thread>
#include <vector>

namespace lockstep {

inline thread_local unsigned tid = 0, bid = 0;
inline thread_local long long calls = 0;  // exchanges this work-item has made

struct Block {
  explicit Block(unsigned n) : bar(n), vals(n), pattern(n), site(n), call(n, 0) {
    for (unsigned w : {32u, 64u}) {
      auto& bars = w == 32 ? warp32 : warp64;
      for (unsigned base = 0; base < n; base += w) bars.emplace_back(std::make_unique<std::barrier<>>(std::min(w, n - base)));
    }
  }
  // The exchanges of a warp (wave) meet at its own barrier, so warps may take different paths between two
  // block barriers (__syncthreads).
  std::barrier<>& warp_bar(unsigned t, unsigned width) { return width == 64 ? *warp64[t / 64] : *warp32[t / 32]; }
  void drop(unsigned t) {
    bar.arrive_and_drop();
    warp32[t / 32]->arrive_and_drop();
    warp64[t / 64]->arrive_and_drop();
  }
  std::barrier<> bar;
  std::vector<std::unique_ptr<std::barrier<>>> warp32, warp64;
  std::vector<unsigned long long> vals;
  std::vector<int> pattern;
  std::vector<std::uintptr_t> site;
  std::vector<long long> call;  // which exchange (1, 2, ...) each lane's published value belongs to
};
inline Block* block = nullptr;

inline std::atomic<long long> errors{0};
inline char first_error[256] = "";
inline long long launches = 0, exchanges = 0;
inline unsigned last_grid = 0, last_block = 0;

inline void report(const char* what, int pattern) {
  if (errors.fetch_add(1) == 0)
    std::snprintf(first_error, sizeof first_error, "%s (block %u, work-item %u, pattern %#x, exchange %lld)",
                  what, bid, tid, pattern, calls);
}

inline void reset() {
  errors = 0;
  first_error[0] = 0;
  launches = exchanges = 0;
}

// A call site as one number: the file name's address (one per file in a build), line and column.
inline std::uintptr_t site_id(const std::source_location& loc) {
  return reinterpret_cast<std::uintptr_t>(loc.file_name()) ^ (std::uintptr_t(loc.line()) << 40) ^
         (std::uintptr_t(loc.column()) << 24);
}

// The value `src_lane(lane)` published, inside this work-item's group of `width` lanes (a warp or wave);
// `src_lane` returns -1 for a lane that reads nothing (the caller's fallback is returned). `loc` is the call
// site of the shuffle / DPP in the kernel.
template <class F>
unsigned long long exchange(unsigned long long value, int pattern, unsigned width, F src_lane,
                            unsigned long long fallback, const std::source_location& loc) {
  Block& b = *block;
  const unsigned t = tid;
  const long long k = ++calls;
  const std::uintptr_t here = site_id(loc);
  b.vals[t] = value;
  b.pattern[t] = pattern;
  b.site[t] = here;
  b.call[t] = k;
  std::barrier<>& bar = width == 32 || width == 64 ? b.warp_bar(t, width) : b.bar;
  bar.arrive_and_wait();

  const unsigned lane = t % width, base = t - lane;
  for (unsigned l = 0; l < width; ++l) {
    const unsigned u = base + l;
    if (u < b.call.size() && b.call[u] == k && b.pattern[u] != pattern)
      report("lanes of one warp/wave disagree on the exchange pattern", pattern);
  }
  unsigned long long result = fallback;
  const int s = src_lane((int)lane);
  if (s >= 0) {
    const unsigned u = base + (unsigned)s;
    if (s >= (int)width || u >= b.call.size() || b.call[u] != k || b.site[u] != here)
      report("the source lane did not make this exchange (divergent control flow)", pattern);
    else result = b.vals[u];
  }
  bar.arrive_and_wait();  // nobody overwrites a slot before every lane has read it
  return result;
}

// Runs `body()` for every work-item of `grid` blocks of `threads`, one block at a time, each work-item on its
// own thread with lockstep::tid / bid set.
template <class Body>
void run(unsigned grid, unsigned threads, Body body) {
  ++launches;
  last_grid = grid;
  last_block = threads;
  for (unsigned g = 0; g < grid; ++g) {
    Block blk(threads);
    block = &blk;
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        tid = t;
        bid = g;
        calls = 0;
        body();
        blk.drop(t);  // a returned work-item no longer takes part in exchanges or barriers
      });
    for (auto& th : pool) th.join();
    for (unsigned t = 0; t < threads; ++t) exchanges += blk.call[t];
    block = nullptr;
  }
}

}  // namespace lockstep
