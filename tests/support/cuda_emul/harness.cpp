// C entry points around the qwen3_tts_rope kernel source compiled for host emulation (see cuda_emul.h), for ctypes.
// Build: g++ -std=c++17 -O1 -shared -fPIC -I tests/support/cuda_emul -x c++ harness.cpp -o harness.so
//        -DKERNEL_SOURCE='"/abs/path/kernels_cuda/qwen3_tts_rope.cu"'
// With -DCUDA_EMUL_LOCKSTEP=1 -std=c++20 -pthread -I tests/support, threads run in lockstep (the modes' kernels
// shuffle) and the lockstep statistics are exported too.
#include KERNEL_SOURCE

namespace {
// ptrs: q, k, cos, sin, q_out, k_out. ints: q_sb q_sh q_ss k_sb k_sh k_ss c_sb c_ss s_sb s_ss
// qo_sb qo_sh qo_ss ko_sb ko_sh ko_ss B S Hq Hkv D.
// modes: positions, q_weight, k_weight (or null); mode_ints: p_sb, p_ss, max_pos, positions_int64, table_fp32,
// eager.
fusedrope::TtsRopeParams params(void** ptrs, const int64_t* ints, void** modes, const int64_t* mode_ints,
                                float eps) {
  fusedrope::TtsRopeParams p;
  p.q = ptrs[0]; p.k = ptrs[1]; p.cos = ptrs[2]; p.sin = ptrs[3]; p.q_out = ptrs[4]; p.k_out = ptrs[5];
  int64_t* f[] = {&p.q_sb, &p.q_sh, &p.q_ss, &p.k_sb, &p.k_sh, &p.k_ss, &p.c_sb, &p.c_ss, &p.s_sb, &p.s_ss,
                  &p.qo_sb, &p.qo_sh, &p.qo_ss, &p.ko_sb, &p.ko_sh, &p.ko_ss, &p.B, &p.S, &p.Hq, &p.Hkv, &p.D};
  for (int i = 0; i < 21; ++i) *f[i] = ints[i];
  p.positions = modes[0]; p.q_weight = modes[1]; p.k_weight = modes[2];
  p.p_sb = mode_ints[0]; p.p_ss = mode_ints[1]; p.max_pos = mode_ints[2];
  p.positions_int64 = mode_ints[3]; p.table_fp32 = mode_ints[4]; p.eager = mode_ints[5];
  p.eps = eps;
  return p;
}
}  // namespace

extern "C" {

int emu_qwen3_tts_rope(void** ptrs, const int64_t* ints, int dtype, int pdl, void** modes, const int64_t* mode_ints,
                       float eps) {
  const fusedrope::TtsRopeParams p = params(ptrs, ints, modes, mode_ints, eps);
  const auto dt = static_cast<fusedrope::TtsRopeDtype>(dtype);
  return static_cast<int>(fusedrope::qwen3_tts_rope_launch(p, dt, nullptr, pdl != 0));
}

int emu_qwen3_tts_rope_pick_vec(void** ptrs, const int64_t* ints, void** modes, const int64_t* mode_ints) {
  return fusedrope::qwen3_tts_rope_pick_vec(params(ptrs, ints, modes, mode_ints, 0.f));
}

long long emu_launch_count() { return emu_launches; }
void emu_last_launch(unsigned* out) {
  out[0] = emu_last_grid.x; out[1] = emu_last_grid.y; out[2] = emu_last_grid.z;
  out[3] = emu_last_block.x; out[4] = emu_last_block.y; out[5] = emu_last_block.z;
}
int emul_last_pdl() { return emu_last_pdl; }
void emul_set_ptx_version(int ptx_version) { emu_ptx_version = ptx_version; }

#ifdef CUDA_EMUL_LOCKSTEP
#include "emul_stats.inc"
#else
long long emu_shuffles() { return emu_shuffles_out_of_lockstep; }
#endif
}
