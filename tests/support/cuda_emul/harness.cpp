// C entry points around a kernel source compiled for host emulation (see cuda_emul.h), for ctypes.
// Build: g++ -std=c++17 -O1 -shared -fPIC -I tests/support/cuda_emul -x c++ harness.cpp -o harness.so
//        -DKERNEL_SOURCE='"/abs/path/kernels_cuda/qwen3_tts_rope.cu"'
#include KERNEL_SOURCE

extern "C" {

// ptrs: q, k, cos, sin, q_out, k_out. ints: q_sb q_sh q_ss k_sb k_sh k_ss c_sb c_ss s_sb s_ss
// qo_sb qo_sh qo_ss ko_sb ko_sh ko_ss B S Hq Hkv D. cfg: vec, warps_per_token, tokens_per_cta, max_blocks.
int emu_qwen3_tts_rope(void** ptrs, const int64_t* ints, int dtype, const int* cfg) {
  fusedrope::TtsRopeParams p;
  p.q = ptrs[0]; p.k = ptrs[1]; p.cos = ptrs[2]; p.sin = ptrs[3]; p.q_out = ptrs[4]; p.k_out = ptrs[5];
  int64_t* f[] = {&p.q_sb, &p.q_sh, &p.q_ss, &p.k_sb, &p.k_sh, &p.k_ss, &p.c_sb, &p.c_ss, &p.s_sb, &p.s_ss,
                  &p.qo_sb, &p.qo_sh, &p.qo_ss, &p.ko_sb, &p.ko_sh, &p.ko_ss, &p.B, &p.S, &p.Hq, &p.Hkv, &p.D};
  for (int i = 0; i < 21; ++i) *f[i] = ints[i];
  fusedrope::TtsRopeLaunchConfig c;
  c.vec = cfg[0]; c.warps_per_token = cfg[1]; c.tokens_per_cta = cfg[2]; c.max_blocks = cfg[3];
  return static_cast<int>(fusedrope::qwen3_tts_rope_launch(p, static_cast<fusedrope::TtsRopeDtype>(dtype), nullptr, &c));
}

int emu_qwen3_tts_rope_pick_vec(void** ptrs, const int64_t* ints) {
  fusedrope::TtsRopeParams p;
  p.q = ptrs[0]; p.k = ptrs[1]; p.cos = ptrs[2]; p.sin = ptrs[3]; p.q_out = ptrs[4]; p.k_out = ptrs[5];
  int64_t* f[] = {&p.q_sb, &p.q_sh, &p.q_ss, &p.k_sb, &p.k_sh, &p.k_ss, &p.c_sb, &p.c_ss, &p.s_sb, &p.s_ss,
                  &p.qo_sb, &p.qo_sh, &p.qo_ss, &p.ko_sb, &p.ko_sh, &p.ko_ss, &p.B, &p.S, &p.Hq, &p.Hkv, &p.D};
  for (int i = 0; i < 21; ++i) *f[i] = ints[i];
  return fusedrope::qwen3_tts_rope_pick_vec(p);
}

long long emu_launch_count() { return emu_launches; }
void emu_last_launch(unsigned* out) {
  out[0] = emu_last_grid.x; out[1] = emu_last_grid.y; out[2] = emu_last_grid.z;
  out[3] = emu_last_block.x; out[4] = emu_last_block.y; out[5] = emu_last_block.z;
}
}
