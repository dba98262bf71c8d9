"""Drop-ins for the call sites engines already have: the same function names, signatures and outputs as the
engine's own op, on fusedrope's backends. Import the one you need: ``fusedrope.integrations.vllm``,
``fusedrope.integrations.aiter``, ``fusedrope.integrations.hf`` (Hugging Face / qwen-tts modeling code)."""
