#!/bin/sh
# 2-core Intel Xeon VM, no GPU (Triton in its CPU interpreter), torch 2.13.0+cpu, triton 3.9.0, at 2950067
python bench/qk_norm_identity.py
