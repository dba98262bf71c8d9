"""What a user's process carries: calling both ops on the reference backend loads at most 2,300 lines of the
package, and neither the benchmark engine, Triton, the extension builder nor the test helpers. (2,000 until every
call refused tensors whose memory does not hold their values, checked the build's digest before loading it and
checked the backends' answers: about 80 lines; 2,100 until op 2's fp32 scale format and n32k4 layout and op 1's
multimodal RoPE: about 160.)"""

import json
import subprocess
import sys

SCRIPT = r"""
import json, sys, torch
import fusedrope
q = torch.randn(1, 2, 3, 8); c = torch.randn(1, 3, 8)
fusedrope.qwen3_tts_rope(q, q[:, :1], c, c, backend="reference")
o = torch.randn(2, 2, 128, dtype=torch.bfloat16); cs = torch.ones(4, 32)
fusedrope.inverse_rope_group_quant(o, torch.arange(2), cs, cs.clone(), 2, backend="reference")
mods = {n: sum(1 for _ in open(m.__file__)) for n, m in sys.modules.items()
        if (n == "fusedrope" or n.startswith("fusedrope.")) and getattr(m, "__file__", None)}
print(json.dumps({"modules": mods, "triton": "triton" in sys.modules}))
"""


def test_reference_calls_of_both_ops_load_a_small_package():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    got = json.loads(out.stdout)
    modules = got["modules"]
    for heavy in ("fusedrope.benchmark", "fusedrope.testing", "fusedrope.jit_ext", "fusedrope.cuda_ext",
                  "fusedrope.hip_ext", "fusedrope.qwen3_tts_rope.triton", "fusedrope.inverse_rope_group_quant.triton"):
        assert heavy not in modules, f"{heavy} loaded by a reference call"
    assert not got["triton"]
    total = sum(modules.values())
    assert total <= 2300, f"{total} lines loaded: {sorted(modules.items(), key=lambda kv: -kv[1])}"
