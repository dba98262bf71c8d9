"""Test helpers for fusedrope and for anyone writing their own kernels for these ops.

* ``TTS_CASES``: the seed shape matrix of qwen3_tts_rope as named cases (6 shapes x batch 1, 8, 32).
* ``make_tts_inputs``: Q/K as strided views of a ``[B, S, H, D]`` projection (what ``q_proj(x).view(...)
  .transpose(1, 2)`` gives) and cos/sin built the way the Qwen3-TTS model builds them.
* ``qwen3_tts_cos_sin``: the model's cos/sin for given positions.
* ``ulp_diff`` / ``assert_ulp_close`` / ``round_once`` / ``tie_allowance``: distance between floating tensors in
  units in the last place; an fp64 value rounded once to a narrower dtype; how many elements a correctly
  rounding kernel may leave off (ties).
* ``assert_tts_rope_close``: qwen3_tts_rope's accuracy contract against the fp64 oracle.
* ``poison_like``: a tensor of the same layout filled with a poison byte, to prove a kernel wrote every element;
  ``guarded_poison`` / ``bytes_written_outside``: such an output inside a bigger poisoned buffer, to prove it
  wrote nothing else.
* ``to_device_keeping_layout``: a strided or offset view moved to another device as the same view;
  ``own_batch_strides``: cos and sin with different batch strides (one broadcast, one misaligned).
* ``QuantCase`` / ``QUANT_CASES`` / ``QUANT_GROUP_SIZE_CASES``: the seed matrices of inverse_rope_group_quant.
* ``deepseek_rope_cache`` / ``make_quant_inputs``: DeepSeek-V4's cos/sin caches and the op's inputs (with
  ``edge_cases=True``: clamped positions, a zero block, exact scale boundaries, NaN and Inf).
* ``scale_bytes`` / ``rope_blocks`` / ``assert_quant_close``: e8m0 bytes of any scale format, which quant blocks
  hold rope dims, and the op's accuracy contract (scales bit-exact; fp8 within 1 ulp, bit-exact in blocks
  without rope dims).
* ``check_backend``: a registered backend (yours: ``fusedrope.register_backend``) over a case matrix of layouts,
  dtypes and edge values, on poisoned outputs, against the oracle.

docs/oracle.md says which inputs expose which bugs.

Example
-------
>>> import fusedrope
>>> from fusedrope.testing import TTS_CASES, assert_tts_rope_close, make_tts_inputs
>>> q, k, cos, sin = make_tts_inputs(TTS_CASES[0], random_cos_sin=True)  # cos/sin halves differ
>>> q_out, k_out = fusedrope.qwen3_tts_rope(q, k, cos, sin, backend="reference")  # your kernel here
>>> assert_tts_rope_close(q_out, k_out, q, k, cos, sin)
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

QWEN3_TTS_ROPE_THETA = 1e6


# --------------------------------------------------------------------------------------------------------
# qwen3_tts_rope cases and inputs
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TtsCase:
    """One qwen3_tts_rope benchmark/test case of the seed matrix.

    Attributes
    ----------
    name : str
        The seed's shape name (``"qwen3_tts"``, ...); ``id`` adds the batch (``"qwen3_tts-B8"``).
    batch, seq_len, num_q_heads, num_kv_heads, head_dim : int
        ``B, S, Hq, Hkv, D``.
    """

    name: str
    batch: int
    seq_len: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int = 128

    @property
    def id(self) -> str:
        return f"{self.name}-B{self.batch}"

    @property
    def seed(self) -> int:
        """A seed of its own for the case's random data, the same in every process (``str`` hashes are salted
        per process)."""
        return zlib.crc32(self.id.encode()) % 1000

    @property
    def rows(self) -> int:
        """Head rows rotated (the seed table's 'rows' column)."""
        return self.batch * self.seq_len * (self.num_q_heads + self.num_kv_heads)

    def bytes_moved(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Ideal traffic: read Q, K, one cos and one sin row per token; write Q and K."""
        e = torch.empty((), dtype=dtype).element_size()
        return (2 * self.rows + 2 * self.batch * self.seq_len) * self.head_dim * e


TTS_SHAPES = {  # name: (S, Hq, Hkv), head_dim 128
    "qwen3_tts": (16, 16, 8),
    "qwen3_tts_full_groups": (17, 16, 8),
    "small_tts": (8, 8, 4),
    "gqa1": (17, 16, 1),
    "no_gqa": (16, 8, 8),
    "wide_heads": (32, 32, 8),
}
TTS_BATCHES = (1, 8, 32)
TTS_CASES = tuple(TtsCase(n, b, s, hq, hkv) for n, (s, hq, hkv) in TTS_SHAPES.items() for b in TTS_BATCHES)


def _check_even(who: str, name: str, v) -> None:
    """Rotations pair dims: an odd width would silently come back one narrower or wider."""
    from ._validation import fail

    if type(v) is not int:
        fail(who, name, "an even int >= 2", repr(v), TypeError)
    if v < 2 or v % 2:
        fail(who, name, "an even int >= 2", repr(v))


def qwen3_tts_cos_sin(positions: torch.Tensor, head_dim: int = 128, theta: float = QWEN3_TTS_ROPE_THETA,
                      dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin as the Qwen3-TTS model builds them: ``emb = cat(freqs, freqs)`` in fp32, then cast.

    Parameters
    ----------
    positions : torch.Tensor
        ``[B, S]`` integer positions (each sequence may start at its own offset).
    head_dim : int, default 128
    theta : float, default 1e6
        rope_theta of the model.
    dtype : torch.dtype, default torch.bfloat16

    Returns
    -------
    (cos, sin) : tuple of torch.Tensor
        ``[B, S, head_dim]`` each, on ``positions``' device.
    """
    _check_even("qwen3_tts_cos_sin", "head_dim", head_dim)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def make_tts_inputs(case: TtsCase, dtype: torch.dtype = torch.bfloat16, device="cpu", seed: int = 0,
                    layout: str = "projection", cos_batch: int | None = None, random_cos_sin: bool = False,
                    subnormal: bool = False):
    """Inputs ``(q, k, cos, sin)`` for a :class:`TtsCase`, from a seeded generator.

    Parameters
    ----------
    case : TtsCase
    dtype : torch.dtype, default torch.bfloat16
    device : str or torch.device, default "cpu"
    seed : int, default 0
    layout : {"projection", "contiguous"}, default "projection"
        ``"projection"``: q/k are ``proj.view(B, S, H, D).transpose(1, 2)`` of one packed ``[B, S, Hq+Hkv, D]``
        buffer (non-contiguous, the common engine layout); ``"contiguous"``: plain ``[B, H, S, D]`` tensors.
    cos_batch : int, optional
        1 to broadcast cos/sin over the batch; default ``case.batch``.
    random_cos_sin : bool, default False
        Independent random cos/sin (the two halves differ), to catch kernels that assume ``cos[i] == cos[i+h]``.
    subnormal : bool, default False
        ``q`` and ``sin`` scaled into ``dtype``'s subnormal range (most values below the smallest normal), so
        that ``q``'s inputs and outputs are subnormal: a kernel that flushes them fails. (``k``'s ``sin`` terms
        are subnormal too, but too small against its ``cos`` terms for a flush to show after rounding.)

    Returns
    -------
    (q, k, cos, sin) : tuple of torch.Tensor
        ``[B, Hq, S, D]``, ``[B, Hkv, S, D]``, ``[cos_batch, S, D]`` twice.
    """
    g = torch.Generator().manual_seed(seed)
    B, S, HQ, HKV, D = case.batch, case.seq_len, case.num_q_heads, case.num_kv_heads, case.head_dim
    if layout == "projection":
        proj = torch.randn(B, S, HQ + HKV, D, generator=g).to(dtype)
        q, k = proj[:, :, :HQ].transpose(1, 2), proj[:, :, HQ:].transpose(1, 2)
    elif layout == "contiguous":
        q = torch.randn(B, HQ, S, D, generator=g).to(dtype)
        k = torch.randn(B, HKV, S, D, generator=g).to(dtype)
    else:
        raise ValueError(f"make_tts_inputs: argument 'layout' expected 'projection' or 'contiguous', got {layout!r}")
    nb = B if cos_batch is None else cos_batch
    if random_cos_sin:
        cos = (torch.rand(nb, S, D, generator=g) * 2 - 1).to(dtype)
        sin = (torch.rand(nb, S, D, generator=g) * 2 - 1).to(dtype)
    else:
        # Each sequence of the batch decodes at its own offset, so a kernel that ignores cos's batch fails.
        start = torch.randint(0, 4096, (nb, 1), generator=g)
        cos, sin = qwen3_tts_cos_sin(start + torch.arange(S), D, dtype=dtype)
    if subnormal:
        tiny = torch.finfo(dtype).tiny
        q = q.copy_((q.float() * (tiny / 8)).to(dtype))  # in place: q keeps its layout
        sin = (sin.float() * (tiny / 4)).to(dtype)
    return tuple(to_device_keeping_layout(t, device) for t in (q, k, cos, sin))


def own_batch_strides(cos: torch.Tensor, sin: torch.Tensor, expanded: str = "cos") -> tuple:
    """``(cos, sin)`` with the same values, where the ``expanded`` one ("cos" or "sin") is its batch 0 expanded
    over B (batch stride 0) and the other sits at batch stride S*D + 4: for odd b and a 2-byte dtype its rows are
    not 16-byte aligned, so a kernel must check each table's batch stride on its own before a 16-byte path."""
    B, S, D = cos.shape
    other = sin if expanded == "cos" else cos
    padded = torch.empty(B, S * D + 4, dtype=other.dtype, device=other.device)
    padded[:, :S * D] = other.reshape(B, S * D)
    strided = padded[:, :S * D].view(B, S, D)
    broadcast = (cos if expanded == "cos" else sin)[:1].expand(B, S, D)
    return (broadcast, strided) if expanded == "cos" else (strided, broadcast)


def to_device_keeping_layout(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` on ``device`` as the same view: its whole storage copied, then the same sizes, strides and storage
    offset. ``t.to(device)`` makes a strided or offset view dense and aligned, which loses the layout a test
    (or a kernel's narrow path) is about.

    Examples
    --------
    >>> import torch
    >>> from fusedrope.testing import to_device_keeping_layout
    >>> v = torch.zeros(1 + 4 * 6)[1:].view(4, 6)[:, 1:5].t()
    >>> m = to_device_keeping_layout(v, "meta")
    >>> m.device.type, m.stride() == v.stride(), m.storage_offset() == v.storage_offset()
    ('meta', True, True)
    """
    device = torch.device(device)
    if t.device == device:
        return t
    storage = t.untyped_storage()
    flat = torch.empty(0, dtype=t.dtype, device=t.device)
    flat.set_(storage, 0, (storage.nbytes() // t.element_size(),), (1,))
    return flat.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


# --------------------------------------------------------------------------------------------------------
# ulp distances
# --------------------------------------------------------------------------------------------------------
_INT_OF = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """Map float bit patterns to integers whose order is the float order (+0 and -0 both map to 0)."""
    bits = x.contiguous().view(_INT_OF[x.element_size()]).to(torch.int64)
    sign_mask = 1 << (8 * x.element_size() - 1)
    return torch.where(bits < 0, -(bits & (sign_mask - 1)), bits)


def _from_ordered(o: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`_ordered` (0 gives +0)."""
    size = torch.empty(0, dtype=dtype).element_size()
    sign = 1 << (8 * size - 1)
    bits = torch.where(o < 0, (-o) | sign, o)
    bits = torch.where(bits >= sign, bits - (1 << (8 * size)), bits)  # as the signed int of that width
    return bits.to(_INT_OF[size]).view(dtype)


def round_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` rounded once to nearest (ties to even) in ``dtype``. torch's float64 -> bfloat16 / float16 / fp8
    casts go through float32 and so can round twice (a value just off a tie lands on the tie, then rounds to
    even); this picks among the cast and its two neighbours the one nearest to ``x``.

    >>> import torch
    >>> x = torch.tensor([1 + 2**-8 + 2**-40], dtype=torch.float64)  # just above a bf16 tie
    >>> x.to(torch.bfloat16).item(), round_once(x, torch.bfloat16).item()
    (1.0, 1.0078125)
    """
    r = x.to(dtype)
    if x.dtype != torch.float64 or dtype in (torch.float64, torch.float32) or r.numel() == 0:
        return r
    o = _ordered(r)
    cands = torch.stack([r, _from_ordered(o - 1, dtype), _from_ordered(o + 1, dtype)])
    cd = cands.double()
    dist = torch.where(torch.isfinite(cd), (cd - x).abs(), torch.full_like(cd, float("inf")))
    bits = cands.view(_INT_OF[cands.element_size()])
    score = (dist > dist.min(0).values).double() * 2 + (bits & 1).double()  # nearest first, then the even one
    best = bits.gather(0, score.argmin(0, keepdim=True)).squeeze(0).view(dtype)
    return torch.where(torch.isfinite(r.double()), best, r)


def ulp_diff(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in ulps of ``actual.dtype`` between ``actual`` and ``expected``.

    Parameters
    ----------
    actual : torch.Tensor
        A floating tensor (bf16, fp16, fp32, fp8, ...).
    expected : torch.Tensor
        Broadcastable to ``actual``; e.g. a float64 oracle. It is rounded once to ``actual.dtype`` first
        (:func:`round_once`), so 0 means "correctly rounded" and 1 means "one representable value away".

    Returns
    -------
    torch.Tensor
        int64 distances. Two NaNs are 0 apart; NaN against a number is ``2**40``; an infinity is one step past
        the largest finite value.
    """
    if expected.dtype != actual.dtype:
        expected = round_once(expected, actual.dtype)
    expected = expected.broadcast_to(actual.shape)
    d = (_ordered(actual) - _ordered(expected)).abs()
    a_nan, e_nan = torch.isnan(actual.float()), torch.isnan(expected.float())
    d = torch.where(a_nan & e_nan, torch.zeros_like(d), d)
    return torch.where(a_nan ^ e_nan, torch.full_like(d, 1 << 40), d)


def tie_allowance(n: int) -> int:
    """How many of ``n`` elements a correct kernel may leave off the correctly rounded value: ``2 + n // 1000``.

    Rounding an exact fp32 sum to bf16 (a double rounding) differs from rounding the exact value once only at
    ties, and an FMA-contracted sum differs from a separately rounded one only next to a rounding boundary: both
    are rare (about 2^-16 of elements or fewer). A kernel that truncates, or rounds an intermediate, is off in
    a large fraction of elements while staying within 1 ulp; this bound tells the two apart."""
    return 2 + n // 1000


def _first(mask: torch.Tensor) -> tuple:
    return tuple(int(i) for i in mask.nonzero()[0])


def assert_ulp_close(actual: torch.Tensor, expected: torch.Tensor, max_ulp: int = 1, what: str = "", *,
                     max_inexact: int | str | None = "ties") -> None:
    """Fail with the worst element's index and values unless every element is within ``max_ulp``, and at most
    ``max_inexact`` elements are not exactly the correctly rounded value.

    Parameters
    ----------
    actual, expected : torch.Tensor
        Same shape and device. ``expected`` is float64 (an oracle: any floating ``actual`` is measured in its
        own ulps, see :func:`ulp_diff`) or has ``actual``'s dtype exactly.
    max_ulp : int, default 1
    what : str, default ""
        Prefix of the failure message.
    max_inexact : int, "ties" or None, default "ties"
        How many elements may differ at all (by at most ``max_ulp``): ``"ties"`` is :func:`tie_allowance` of the
        element count (what a correctly rounding kernel meets; a truncating one fails), None no limit.

    Raises
    ------
    AssertionError
        Saying how many elements are off, and the worst (or first inexact) one; or what differs in shape, dtype
        or device.
    """
    if actual.shape != expected.shape:
        raise AssertionError(f"{what} shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    if not actual.is_floating_point() or (expected.dtype != torch.float64 and actual.dtype != expected.dtype):
        raise AssertionError(f"{what} dtype {actual.dtype}, expected {expected.dtype}")
    if actual.device != expected.device:
        raise AssertionError(f"{what} on {actual.device}, expected on {expected.device}")
    if actual.numel() == 0:
        return
    d = ulp_diff(actual, expected)
    worst = int(d.max())
    if worst > max_ulp:
        idx = tuple(int(i) for i in torch.unravel_index(d.argmax(), d.shape))
        raise AssertionError(
            f"{what} {int((d > max_ulp).sum())} of {d.numel()} elements are more than {max_ulp} ulp away; "
            f"worst {worst} ulp at {idx}: got {actual[idx].item()!r}, expected {expected[idx].item()!r}"
        )
    allowed = tie_allowance(d.numel()) if max_inexact == "ties" else max_inexact
    off = int((d != 0).sum()) if allowed is not None else 0
    if allowed is not None and off > allowed:
        idx = _first(d != 0)
        raise AssertionError(
            f"{what} {off} of {d.numel()} elements are not correctly rounded (at most {allowed} may be, for "
            f"rounding ties); first at {idx}: got {actual[idx].item()!r}, expected {expected[idx].item()!r} "
            "(a kernel that truncates or rounds an intermediate result is off in many)"
        )


def assert_tts_rope_close(q_out: torch.Tensor, k_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          cos: torch.Tensor, sin: torch.Tensor, what: str = "",
                          oracle: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """The accuracy contract of ``qwen3_tts_rope``, against the fp64 oracle of the inputs.

    bf16 / fp16: within 1 ulp of the oracle, and correctly rounded except for rare ties
    (:func:`assert_ulp_close` with ``max_inexact="ties"``). fp32: within two fp32 roundings of the terms'
    magnitude, ``(|x*cos| + |rotate_half(x)*sin|) * 2^-22`` per element (cancellation makes ulps meaningless).

    Parameters
    ----------
    q_out, k_out : torch.Tensor
        The outputs to check, shaped like ``q`` and ``k`` (any strides).
    q, k, cos, sin : torch.Tensor
        The inputs as they were before the call (clone them first for ``inplace=True``).
    what : str, default ""
        Prefix of the failure message.
    oracle : (torch.Tensor, torch.Tensor), optional
        ``qwen3_tts_rope_oracle(q, k, cos, sin)`` when the caller has it already (it is computed otherwise).

    Raises
    ------
    AssertionError
        Naming the output, how many elements are off and the worst or first one.
    ValueError, TypeError
        Inputs outside the op's shape contract (e.g. a 2-D ``[S, D]`` cos, which would broadcast by head).
    """
    from .reference import check_shapes, qwen3_tts_rope_oracle, rotate_half

    check_shapes(q, k, cos, sin, "assert_tts_rope_close")
    q_ref, k_ref = oracle if oracle is not None else qwen3_tts_rope_oracle(q, k, cos, sin)
    for out, ref, x, name in ((q_out, q_ref, q, "q"), (k_out, k_ref, k, "k")):
        label = f"{what} {name}".strip()
        if out.dtype != x.dtype:
            raise AssertionError(f"{label} dtype {out.dtype}, expected {x.dtype} (the input's)")
        if out.dtype != torch.float32:
            assert_ulp_close(out, ref, 1, label)
            continue
        if out.shape != ref.shape:
            raise AssertionError(f"{label} shape {tuple(out.shape)} != {tuple(ref.shape)}")
        xd, c, s_ = x.double(), cos.double().unsqueeze(1), sin.double().unsqueeze(1)
        bound = (xd.abs() * c.abs() + rotate_half(xd).abs() * s_.abs()) * 2**-22 + 1e-38
        err = (out.double() - ref).abs()
        bad = ~(err <= bound)
        if bool(bad.any()):
            idx = _first(bad)
            raise AssertionError(f"{label} {int(bad.sum())} of {bad.numel()} fp32 elements are off by more than two "
                                 f"roundings; first at {idx}: got {out[idx].item()!r}, expected "
                                 f"{ref[idx].item()!r} (bound {bound[idx].item():.3g})")


def poison_like(t: torch.Tensor, byte: int | None = None) -> torch.Tensor:
    """An uninitialised-looking tensor with ``t``'s shape, strides and dtype, so that any element a kernel
    forgets to write fails a comparison.

    Parameters
    ----------
    t : torch.Tensor
    byte : int, optional
        The value of every byte of its storage; default a NaN pattern: 0xFF, or 0x80 for the fnuz fp8 types.

    Returns
    -------
    torch.Tensor
    """
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(out.untyped_storage())
    raw.fill_(_poison_byte(t.dtype, byte))
    return out


def _poison_byte(dtype: torch.dtype, byte: int | None) -> int:
    return byte if byte is not None else 0x80 if "fnuz" in str(dtype) else 0xFF


def guarded_poison(shape, dtype: torch.dtype, device="cpu", strides=None, lead: int = 64, tail: int | None = None,
                   byte: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """An output view inside a bigger poisoned buffer, so that a kernel's write out of bounds (which a memory
    checker misses when it lands in the allocator's slack) changes guard bytes that
    :func:`bytes_written_outside` counts.

    Parameters
    ----------
    shape : sequence of int
    dtype : torch.dtype
    device : torch.device or str, default "cpu"
    strides : sequence of int, optional
        The view's strides; default contiguous.
    lead : int, default 64
        Guard elements before the view (its storage offset); an odd value misaligns it.
    tail : int, optional
        Guard elements after the view's last element; default as many as the view spans plus 64, so that a
        write one row or one token past the end still lands in the buffer (before the view there are ``lead``).
    byte : int, optional
        The poison in every byte; default :func:`poison_like`'s (for the fnuz fp8 types 0x80, which is also
        their NaN: pass another byte where a kernel may legitimately write NaN).

    Returns
    -------
    (view, buffer) : tuple of torch.Tensor

    Examples
    --------
    >>> import torch
    >>> from fusedrope.testing import bytes_written_outside, guarded_poison
    >>> out, buf = guarded_poison((2, 3), torch.bfloat16)
    >>> out.fill_(1.0) is out, bytes_written_outside(buf, out)
    (True, 0)
    >>> buf[64 + 6] = 0  # one element past the view
    >>> bytes_written_outside(buf, out)
    2
    """
    shape = tuple(shape)
    if strides is None:
        strides = torch.empty(shape, device="meta").stride()
    span = 1 + sum((n - 1) * st for n, st in zip(shape, strides)) if all(shape) else 0
    buf = torch.empty(lead + span + (span + 64 if tail is None else tail), dtype=dtype, device=device)
    buf.view(torch.uint8).fill_(_poison_byte(dtype, byte))
    return buf.as_strided(shape, tuple(strides), lead), buf


def bytes_written_outside(buf: torch.Tensor, view: torch.Tensor, byte: int | None = None) -> int:
    """How many bytes of ``buf`` (from :func:`guarded_poison`) outside ``view``'s elements no longer hold the
    poison ``byte`` (default :func:`poison_like`'s for the dtype, as there)."""
    idx = torch.arange(buf.numel(), device=buf.device).as_strided(view.shape, view.stride(),
                                                                  view.storage_offset())
    outside = torch.ones(buf.numel(), dtype=torch.bool, device=buf.device)
    outside[idx.reshape(-1)] = False
    raw = buf.view(torch.uint8).view(buf.numel(), buf.element_size())
    return int((raw[outside] != _poison_byte(buf.dtype, byte)).sum())


# --------------------------------------------------------------------------------------------------------
# inverse_rope_group_quant cases and inputs
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantCase:
    """One inverse_rope_group_quant benchmark/test case: ``o [num_tokens, num_heads, head_dim]``,
    ``num_groups`` groups, the last ``rope_dim`` dims of each head rotated, one scale per ``quant_group_size``
    elements. ``id`` reads ``"S8-H16-G2-D512-R64-g128"``."""

    num_tokens: int
    num_heads: int
    num_groups: int
    head_dim: int = 512
    rope_dim: int = 64
    quant_group_size: int = 128

    @property
    def id(self) -> str:
        return (f"S{self.num_tokens}-H{self.num_heads}-G{self.num_groups}-D{self.head_dim}-R{self.rope_dim}"
                f"-g{self.quant_group_size}")

    def bytes_moved(self, o_dtype=torch.bfloat16, cache_dtype=torch.bfloat16) -> int:
        """The seed's byte count: read o, one cos and one sin row per token; write fp8 (1 B) + one scale byte
        per block."""
        S, H, D = self.num_tokens, self.num_heads, self.head_dim
        o_bytes = S * H * D * torch.empty((), dtype=o_dtype).element_size()
        rope_bytes = S * self.rope_dim * torch.empty((), dtype=cache_dtype).element_size()  # cos + sin halves
        return o_bytes + rope_bytes + S * H * D + S * H * D // self.quant_group_size


QUANT_SEQ_LENS = (1, 8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384)
QUANT_HEAD_GROUPS = {"V4-Pro-TP8": (16, 2), "V4-Flash-TP8": (8, 1)}
QUANT_CASES = tuple(QuantCase(s, h, g) for (h, g) in QUANT_HEAD_GROUPS.values() for s in QUANT_SEQ_LENS)
QUANT_GROUP_SIZE_CASES = tuple(QuantCase(s, 16, 2, quant_group_size=gs) for s in (2048, 8192) for gs in (32, 64, 128))


def deepseek_rope_cache(max_pos: int, rope_dim: int = 64, theta: float = 10000.0, dtype=torch.float32,
                        device="cpu"):
    """``(cos_cache, sin_cache)`` as strided views of one combined ``[max_pos, rope_dim]`` cos|sin cache (how
    engines keep it).

    Parameters
    ----------
    max_pos : int
    rope_dim : int, default 64
    theta : float, default 10000.0
    dtype : torch.dtype, default torch.float32
    device : str or torch.device, default "cpu"
        Where the combined cache lives (built there, so the two views keep their row stride).

    Returns
    -------
    (cos_cache, sin_cache) : tuple of torch.Tensor
        ``[max_pos, rope_dim/2]`` each, row stride ``rope_dim``.
    """
    _check_even("deepseek_rope_cache", "rope_dim", rope_dim)
    inv_freq = 1.0 / theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim)
    freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype=dtype, device=device)
    return cache[:, : rope_dim // 2], cache[:, rope_dim // 2:]


def make_quant_inputs(case: QuantCase, dtype=torch.bfloat16, cache_dtype=torch.float32, device="cpu",
                      seed: int = 0, max_pos: int = 4096, positions_dtype=torch.int64, edge_cases: bool = False):
    """``(o, positions, cos_cache, sin_cache)`` for a :class:`QuantCase`, from a seeded generator.

    ``o`` has magnitudes that vary by token and by head over ~12 binades (so the scales differ block to
    block); positions are random in ``[0, max_pos)``; the cache comes from :func:`deepseek_rope_cache`.
    ``edge_cases=True`` adds what random data rarely or never holds, each where the shape leaves room: positions
    ``-7``, ``max_pos`` and ``max_pos + 10**6`` (clamped), an all-zero block (the amax floor), blocks whose amax
    is exactly ``448 * 2^k`` and ``240 * 2^k`` (the scale boundaries of both fp8 formats), and one NaN and one
    infinity in blocks of their own (confined to their block).

    Parameters
    ----------
    case : QuantCase
    dtype : torch.dtype, default torch.bfloat16
        ``o``'s dtype.
    cache_dtype : torch.dtype, default torch.float32
    device : str or torch.device, default "cpu"
    seed : int, default 0
    max_pos : int, default 4096
    positions_dtype : torch.dtype, default torch.int64
    edge_cases : bool, default False

    Returns
    -------
    (o, positions, cos_cache, sin_cache) : tuple of torch.Tensor
    """
    g = torch.Generator().manual_seed(seed)
    S, H, D = case.num_tokens, case.num_heads, case.head_dim
    mag = torch.exp2(torch.randint(-6, 7, (S, H, 1), generator=g).float())
    o = torch.randn(S, H, D, generator=g) * mag
    positions = torch.randint(0, max_pos, (S,), generator=g)
    if edge_cases and o.numel():
        positions[:3] = torch.tensor([-7, max_pos, max_pos + 10**6])[:S]
        _plant_edge_blocks(o.view(S, -1), case.quant_group_size, g)
    o, positions = o.to(dtype), positions.to(positions_dtype)
    cos, sin = deepseek_rope_cache(max_pos, case.rope_dim, dtype=cache_dtype)
    return tuple(to_device_keeping_layout(t, device) for t in (o, positions, cos, sin))


def _plant_edge_blocks(rows: torch.Tensor, block: int, g: torch.Generator) -> None:
    """Overwrite quant blocks of ``rows [S, H*D]`` (fp32) in turn: all zero; amax exactly 448 * 2^k and 240 * 2^k
    for random k (exact in bf16 and fp16); one NaN; one infinity. Blocks picked at random, one per kind."""
    blocks = rows.view(-1, block)
    kinds = ("zero", 448.0, 240.0, "nan", "inf")
    picks = torch.randperm(blocks.shape[0], generator=g)[:len(kinds)].tolist()
    for kind, b in zip(kinds, picks):
        i = int(torch.randint(0, block, (1,), generator=g))
        if kind == "zero":
            blocks[b] = 0.0
        elif kind in ("nan", "inf"):
            blocks[b, i] = float(kind)
        else:
            k = int(torch.randint(-4, 5, (1,), generator=g))
            blocks[b] = blocks[b].clamp(-kind * 2.0**k, kind * 2.0**k)
            blocks[b, i] = -kind * 2.0**k if i % 2 else kind * 2.0**k


def rope_blocks(case: QuantCase) -> torch.Tensor:
    """Which quant blocks of a token row hold rope dims.

    Parameters
    ----------
    case : QuantCase

    Returns
    -------
    torch.Tensor
        ``[G, Ks]`` bool.
    """
    col = torch.arange(case.num_heads * case.head_dim)
    is_rope = (col % case.head_dim) >= case.head_dim - case.rope_dim
    return is_rope.reshape(case.num_groups, -1, case.quant_group_size).any(-1)


def scale_bytes(x_scale: torch.Tensor) -> torch.Tensor:
    """The e8m0 bytes ``[S, G, Ks]`` of a scale tensor in any of the op's scale formats.

    Parameters
    ----------
    x_scale : torch.Tensor
        ``float8_e8m0fnu`` or ``uint8`` (the bytes), ``float32`` (2^(byte-127), NaN for 0xFF) or ``int32``
        (packed: block ``4j+i`` in bits ``8i .. 8i+7`` of word ``j``); either layout.

    Returns
    -------
    torch.Tensor
        uint8, contiguous.
    """
    if x_scale.dtype == torch.int32:
        words = x_scale.to(torch.int64) & 0xFFFFFFFF
        shifts = torch.arange(4, device=x_scale.device) * 8
        return ((words[..., None] >> shifts) & 0xFF).to(torch.uint8).flatten(-2)
    if x_scale.dtype == torch.float32:
        bits = x_scale.contiguous().view(torch.int32)
        byte = torch.where(torch.isnan(x_scale), 0xFF, (bits >> 23) & 0xFF)
        # only 2^(byte-127) (2^-127 is an fp32 subnormal) or NaN is an e8m0 scale; 0, Inf, -1, 1.5 are not
        exact = torch.where(byte == 0xFF, torch.isnan(x_scale),
                            x_scale.double() == torch.exp2(byte.double() - 127))
        if not bool(exact.all()):
            idx = tuple(int(i) for i in (~exact).nonzero()[0])
            raise ValueError(f"scale_bytes: a float32 scale must be 2^k for k in [-127, 127] or NaN, got "
                             f"{x_scale[idx].item()!r} at {idx}")
        return byte.to(torch.uint8)
    return x_scale.contiguous().view(torch.uint8)


def _column_major(scale: torch.Tensor) -> bool:
    """Whether S is the fastest dim of a ``[S, G, Ks]`` scale tensor (``transpose_scale=True``); a tensor with
    one token, or one block per token, is laid out the same either way."""
    S, G, K = scale.shape
    return S > 1 and G * K > 1 and scale.stride(0) == 1


def assert_quant_close(x_fp8, x_scale, ref_fp8, ref_scale, rope_block_mask: torch.Tensor, what: str = "") -> None:
    """The accuracy contract of ``inverse_rope_group_quant``: scale bytes bit-exact; fp8 within 1 ulp, bit-exact
    in blocks with no rope dims, and in rope blocks correctly rounded except for rare ties (:func:`tie_allowance`
    of their element count: an FMA-contracted rotation may land on the other side of a rounding boundary).

    Parameters
    ----------
    x_fp8, x_scale : torch.Tensor
        The outputs to check (any scale format and layout).
    ref_fp8, ref_scale : torch.Tensor
        The reference outputs, e.g. ``backend="reference"``.
    rope_block_mask : torch.Tensor
        ``[G, Ks]`` bool, from :func:`rope_blocks`.
    what : str, default ""
        Prefix of the failure message.

    Raises
    ------
    AssertionError
        Naming the first differing block or how many elements are off.
    """
    if x_fp8.dtype != ref_fp8.dtype:
        raise AssertionError(f"{what} fp8 dtype {x_fp8.dtype}, expected {ref_fp8.dtype}")
    if x_scale.dim() != 3 or x_scale.shape[:2] != ref_scale.shape[:2]:
        raise AssertionError(f"{what} scale shape {tuple(x_scale.shape)}, expected [S, G, Ks] like "
                             f"{tuple(ref_scale.shape)}")
    if _column_major(x_scale) != _column_major(ref_scale):
        raise AssertionError(f"{what} scale layout: strides {tuple(x_scale.stride())}, expected the layout of "
                             f"{tuple(ref_scale.stride())} ({'column' if _column_major(ref_scale) else 'row'}-major)")
    got_b, ref_b = scale_bytes(x_scale), scale_bytes(ref_scale)
    if got_b.shape != ref_b.shape:
        raise AssertionError(f"{what} scale blocks {tuple(got_b.shape)}, expected {tuple(ref_b.shape)}")
    if not torch.equal(got_b, ref_b):
        idx = _first(got_b != ref_b)
        raise AssertionError(f"{what} scale bytes differ in {int((got_b != ref_b).sum())} blocks; first at "
                             f"{idx}: got {int(got_b[idx])}, expected {int(ref_b[idx])}")
    assert_ulp_close(x_fp8, ref_fp8, 1, f"{what} fp8", max_inexact=None)
    S, G, Ks = ref_b.shape
    per_block = (S, G, Ks, x_fp8.shape[-1] // Ks)
    rope = rope_block_mask.to(x_fp8.device)[None, :, :, None].expand(per_block)
    got, ref = x_fp8.view(torch.uint8).reshape(per_block), ref_fp8.view(torch.uint8).reshape(per_block)
    differ = got != ref
    if bool((differ & ~rope).any()):
        idx = _first(differ & ~rope)
        raise AssertionError(f"{what} fp8 bytes differ in {int((differ & ~rope).sum())} elements of non-rope "
                             f"blocks (which must be bit-exact); first at [s, g, block, i] = {idx}: got "
                             f"{int(got[idx]):#04x}, expected {int(ref[idx]):#04x}")
    off, allowed = int(differ.sum()), tie_allowance(int(rope.sum()))
    if off > allowed:
        idx = _first(differ)
        raise AssertionError(f"{what} fp8 bytes differ in {off} elements of rope blocks (at most {allowed} may, for "
                             f"rounding ties); first at [s, g, block, i] = {idx}: got {int(got[idx]):#04x}, expected "
                             f"{int(ref[idx]):#04x} (a kernel that truncates or rounds the rotation is off in many)")


# --------------------------------------------------------------------------------------------------------
# a whole backend against the contract
# --------------------------------------------------------------------------------------------------------
def check_backend(op: str, backend: str, device="cpu") -> int:
    """Run ``backend`` of ``op`` through the public function over a small matrix of the contract's cases and
    raise at the first one it gets wrong; cases its ``supports`` refuses are passed over.

    ``qwen3_tts_rope``: every seed shape (batch 1) with q/k as strided views of one projection and cos/sin
    halves that differ, cos broadcast over a batch of 2, bf16/fp16/fp32, head_dim 64 and 256, subnormal inputs,
    in place and into poisoned buffers. ``inverse_rope_group_quant``: both seed (H, G), all group sizes, both scale
    layouts, the e8m0, uint8, float32 and packed int32 scale formats, both fp8 formats, edge values (clamped
    positions, a zero block, exact scale boundaries, NaN and Inf), into poisoned buffers, against the reference.

    Parameters
    ----------
    op : str
        ``"qwen3_tts_rope"`` or ``"inverse_rope_group_quant"``.
    backend : str
        A backend of ``op`` that can run on ``device``.
    device : str or torch.device, default "cpu"

    Returns
    -------
    int
        How many cases ran (at least one, or it raises).

    Raises
    ------
    AssertionError
        Naming the case and what is wrong.

    Examples
    --------
    >>> import fusedrope
    >>> from fusedrope.testing import check_backend
    >>> check_backend("qwen3_tts_rope", "reference") > 0
    True
    """
    from . import registry

    reg, device = registry(op), torch.device(device)
    cases = _tts_backend_cases(device) if op == "qwen3_tts_rope" else _quant_backend_cases(device)
    ran = 0
    for name, key, check in cases:
        if reg.decide(reg.backend(backend), key) is None:
            try:
                check(backend)
            except AssertionError as e:
                raise AssertionError(f"{op} backend {backend!r}, case {name}: {e}") from None
            ran += 1
    if not ran:
        raise AssertionError(f"{op} backend {backend!r} serves none of check_backend's cases on {device}")
    return ran


def _tts_backend_cases(device):
    import fusedrope
    from .qwen3_tts_rope import validate

    def case(name, inputs, inplace=False):
        def check(backend):
            q, k, cos, sin = inputs
            if inplace:
                q_in, k_in = q.clone(), k.clone()
                fusedrope.qwen3_tts_rope(q, k, cos, sin, inplace=True, backend=backend)
                assert_tts_rope_close(q, k, q_in, k_in, cos, sin, "in place")
                q.copy_(q_in), k.copy_(k_in)
                return
            (q_out, q_buf), (k_out, k_buf) = (guarded_poison(t.shape, t.dtype, t.device) for t in (q, k))
            fusedrope.qwen3_tts_rope(q, k, cos, sin, q_out=q_out, k_out=k_out, backend=backend)
            assert_tts_rope_close(q_out, k_out, q, k, cos, sin)
            for out, buf in ((q_out, q_buf), (k_out, k_buf)):
                assert bytes_written_outside(buf, out) == 0, "wrote outside its output"
            assert_tts_rope_close(*fusedrope.qwen3_tts_rope(q, k, cos, sin, backend=backend), q, k, cos, sin,
                                  "new outputs")
        return name, validate(*inputs, inplace), check

    out = [case(c.id, make_tts_inputs(c, device=device, seed=c.seed, random_cos_sin=True))
           for c in TTS_CASES if c.batch == 1]
    small = TtsCase("small", 2, 5, 4, 2)
    out.append(case("small-cos-broadcast", make_tts_inputs(small, device=device, seed=2, cos_batch=1)))
    for dtype in (torch.float16, torch.float32):
        out.append(case(f"small-{dtype}", make_tts_inputs(small, dtype, device, seed=3, layout="contiguous")))
    for d in (64, 256):
        out.append(case(f"small-D{d}", make_tts_inputs(TtsCase("d", 1, 3, 2, 1, d), device=device, seed=d)))
    out.append(case("subnormal", make_tts_inputs(TtsCase("sub", 1, 4, 2, 1, 64), device=device, seed=5,
                                                 subnormal=True)))
    out.append(case("in place", make_tts_inputs(small, device=device, seed=6, random_cos_sin=True), inplace=True))
    return out


def _quant_backend_cases(device):
    import fusedrope
    from .inverse_rope_group_quant import QuantModes, validate

    def case(name, c, fp8=torch.float8_e4m3fn, scale=torch.float8_e8m0fnu, transpose=False):
        args = (*make_quant_inputs(c, device=device, seed=c.num_tokens, edge_cases=True), c.num_groups,
                c.quant_group_size, transpose)

        def check(backend):
            want = fusedrope.empty_quant_outputs(args[0], *args[4:], fp8_dtype=fp8, scale_dtype=scale)
            (x_fp8, x_buf), (x_scale, s_buf) = (guarded_poison(t.shape, t.dtype, t.device, t.stride(), byte=0x55)
                                                for t in want)
            fusedrope.inverse_rope_group_quant(*args, x_fp8, x_scale, backend=backend)
            ref = fusedrope.inverse_rope_group_quant(*args, fp8_dtype=fp8, scale_dtype=scale, backend="reference")
            assert_quant_close(x_fp8, x_scale, *ref, rope_blocks(c))
            for out, buf in ((x_fp8, x_buf), (x_scale, s_buf)):
                assert bytes_written_outside(buf, out, 0x55) == 0, "wrote outside its output"
            new = fusedrope.inverse_rope_group_quant(*args, fp8_dtype=fp8, scale_dtype=scale, backend=backend)
            assert_quant_close(*new, *ref, rope_blocks(c), "new outputs")
        return f"{name}-{c.id}", validate(*args, modes=QuantModes(fp8, scale))[0], check

    out = []
    for h, g in QUANT_HEAD_GROUPS.values():
        for gs in (32, 64, 128, 256):
            out.append(case("seed", QuantCase(3, h, g, quant_group_size=gs), transpose=gs == 64))
    out.append(case("fnuz", QuantCase(2, 16, 2), fp8=torch.float8_e4m3fnuz))
    for scale in (torch.uint8, torch.float32, torch.int32):
        out.append(case(str(scale).replace("torch.", ""), QuantCase(2, 8, 1), scale=scale, transpose=True))
    out.append(case("other head_dim", QuantCase(3, 2, 2, head_dim=192, rope_dim=32, quant_group_size=64)))
    return out
