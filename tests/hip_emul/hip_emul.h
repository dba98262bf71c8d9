// A wave emulator for the HIP kernel (kernels_hip/inverse_rope_group_quant.hip) on the CPU: the kernel source is
// compiled as host C++ by clang (its ext_vector_type and __builtin_elementwise_max are clang's) with the few
// AMDGPU builtins it uses mapped to the functions below, and every work-item runs as its own std::thread, so
// the DPP cross-lane reads happen in lockstep exactly as on a wave64 GPU:
//
//   * __builtin_amdgcn_update_dpp: every lane publishes its value, all lanes of the block meet at a barrier,
//     each reads its source lane inside its 16-lane row (quad_perm, row_half_mirror, row_mirror; any other
//     control is reported), then they meet again before the slots are reused. Row/bank masks and bound_ctrl as
//     the ISA manual defines them.
//   * A lane whose source lane did not execute the same DPP call (divergent control flow, or a lane that has
//     already returned) is an error, as is a wave whose lanes disagree on the control: both are undefined on
//     the hardware, so the emulator records them instead of inventing a value.
//   * __builtin_amdgcn_workitem_id_x / workgroup_id_x: the thread's ids; __builtin_amdgcn_fmed3f: the median;
//     address_space(1) pointers become plain pointers, and the launch bounds attribute is dropped.
//
// Not emulated: v_cvt_pk_fp8_f32 (the host compile has no gfx9 macros, so the kernel's exact software fp8 path
// runs; the hardware path is checked in the ISA tests and owed on AMD hardware).
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdio>
#include <thread>
#include <vector>

namespace hip_emul {

inline thread_local unsigned tid = 0, bid = 0;
inline thread_local long long dpp_calls = 0;  // DPP calls this work-item has made

struct Block {
  explicit Block(unsigned n) : bar(n), vals(n), ctrl(n), call(n, 0) {}
  std::barrier<> bar;
  std::vector<int> vals, ctrl;
  std::vector<long long> call;  // which DPP call (1, 2, ...) each lane's published value belongs to
};
inline Block* block = nullptr;

inline std::atomic<long long> errors{0};
inline char first_error[256] = "";
inline long long launches = 0, dpp_total = 0;
inline unsigned last_grid = 0, last_block = 0;

inline void report(const char* what, unsigned t, int ctrl) {
  if (errors.fetch_add(1) == 0)
    std::snprintf(first_error, sizeof first_error, "%s (block %u, work-item %u, DPP control %#x, call %lld)",
                  what, bid, t, ctrl, dpp_calls);
}

// Source position inside the 16-lane row for the DPP controls the kernel may use; -1 for any other.
inline int dpp_source(int ctrl, int pos) {
  if (ctrl >= 0 && ctrl <= 0xFF) return (pos & ~3) | ((ctrl >> (2 * (pos & 3))) & 3);  // quad_perm
  if (ctrl == 0x140) return 15 - pos;                                                   // row_mirror
  if (ctrl == 0x141) return (pos & 8) | (7 - (pos & 7));                                // row_half_mirror
  return -1;
}

inline int update_dpp(int old, int src, int ctrl, int row_mask, int bank_mask, bool bound_ctrl) {
  Block& b = *block;
  const unsigned t = tid;
  const long long k = ++dpp_calls;
  b.vals[t] = src;
  b.ctrl[t] = ctrl;
  b.call[t] = k;
  b.bar.arrive_and_wait();

  const unsigned lane = t % 64, wave0 = t - lane, row = lane / 16, pos = lane % 16;
  for (unsigned l = 0; l < 64; ++l) {
    const unsigned u = wave0 + l;
    if (u < b.call.size() && b.call[u] == k && b.ctrl[u] != ctrl) report("lanes of a wave disagree on the DPP control", t, ctrl);
  }
  int result = old;
  const int sp = dpp_source(ctrl, (int)pos);
  const bool enabled = ((row_mask >> row) & 1) && ((bank_mask >> (pos / 4)) & 1);
  if (sp < 0) {
    report("unsupported DPP control", t, ctrl);
  } else if (enabled) {
    const unsigned s = wave0 + row * 16 + (unsigned)sp;
    if (s >= b.call.size() || b.call[s] != k) {
      report("the source lane did not execute this DPP call", t, ctrl);
      result = bound_ctrl ? 0 : old;
    } else {
      result = b.vals[s];
    }
  }
  b.bar.arrive_and_wait();  // nobody overwrites a slot before every lane has read it
  return result;
}

inline float fmed3(float a, float b, float c) { return std::max(std::min(a, b), std::min(std::max(a, b), c)); }

// Runs `kernel(args)` for grid x block work-items, one block at a time, each work-item on its own thread.
template <class Args>
void launch(void (*kernel)(Args), unsigned grid, unsigned threads, const Args& args) {
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
        dpp_calls = 0;
        kernel(args);
        blk.bar.arrive_and_drop();  // a returned lane no longer takes part in DPP barriers
      });
    for (auto& th : pool) th.join();
    for (unsigned t = 0; t < threads; ++t) dpp_total += blk.call[t];
    block = nullptr;
  }
}

}  // namespace hip_emul

#define __builtin_amdgcn_workitem_id_x() (hip_emul::tid)
#define __builtin_amdgcn_workgroup_id_x() (hip_emul::bid)
#define __builtin_amdgcn_update_dpp hip_emul::update_dpp
#define __builtin_amdgcn_fmed3f hip_emul::fmed3
#define address_space(n)
#define amdgpu_flat_work_group_size(lo, hi)
