# The one device call that wrote this folder and the two beside it (nvidia-h200-quick-9147894/ and, cut short,
# the first try of nvidia-h200-pytest-bench-9147894/), on a fresh H200 machine, 2026-12-04 17:58-18:06 UTC,
# 461 s of command time; carry: [".whl"] (liger_kernel-0.8.5-py3-none-any.whl, gpu/fetch_wheels.sh):
FUSEDROPE_GIT_COMMIT=9147894fe8a13d2f6f597594f8619d49a95bf0b6 FUSEDROPE_GIT_DIRTY=0 SESSION_S=480 OUT=$OUT bash gpu/session.sh
# gpu/session.sh ran gpu/run_all.sh with TOTAL_S=280 (this folder: log.txt, tts/, quant/; op 1's script got a
# 91 s budget, so its bench skipped wide_heads-B8 and its compile, sanitize and sweep sections), then
# `python -m fusedrope bench --quick --budget-s 118` (nvidia-h200-quick-9147894/), then pytest bench/, which its
# 120 s limit cut (rc 124) before it wrote its JSON. session-log.txt is everything the call printed.
