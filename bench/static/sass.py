"""The warp-instructions an NVIDIA kernel issues, read from its SASS by a lane-level interpreter of the integer
and control part of the ISA, run over the warps of a launch.

Why an interpreter: what a warp issues depends on its path (uniform branches on the launch's arguments,
divergent ones on the lane, loop trips). Each lane's registers hold a known integer or None (unknown: a value
loaded from memory, or a float computed from one). A branch whose predicate is known on every active lane is
followed exactly, splitting the warp where the lanes disagree and merging it at the convergence barrier (BSSY /
BSYNC) as the hardware does, so both sides of a divergent branch are issued, once each. A branch on an unknown
value follows both sides and is counted in ``data_branches`` (an upper bound). Every instruction reached is issued
once by the warp, whether its guard holds on any lane or not; ``predicated_off`` counts those it holds on none,
and ``lane_use`` the fraction of (issued x 32) lane slots whose lane was active and guarded on.

``Kernel(sass)`` takes one function's ``cuobjdump -sass``; :func:`launch_counts` simulates a sample of a launch's
blocks with the kernel's parameter bytes and returns a :class:`Count`.
"""

from __future__ import annotations

import functools
import math
import re
import struct
from collections import Counter
from dataclasses import dataclass, field

M32 = 0xFFFFFFFF
PARAM_BASE = 0x210  # sm_90: parameters from c[0x0][0x210]; c[0x0][0x0..0x14] hold ntid.xyz and nctaid.xyz
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;")
CONTROL = {"BRA", "EXIT", "BSSY", "BSYNC", "CALL", "RET", "JMP", "BRX", "JMX", "WARPSYNC", "BREAK"}
MEMORY = {"LDG", "STG", "LDS", "STS", "LD", "ST", "LDL", "STL", "ATOM", "ATOMG", "ATOMS", "RED", "REDG", "LDSM",
          "LDGSTS", "UBLKCP", "UTMALDG", "UTMASTG"}
CROSS_LANE = {"SHFL", "VOTE", "VOTEU", "MATCH", "REDUX"}
_WIDTH = {"128": 16, "64": 8, "U8": 1, "S8": 1, "U16": 2, "S16": 2}


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & M32))[0]


def _bits(x: float) -> int:
    try:
        return struct.unpack("<I", struct.pack("<f", x))[0]
    except OverflowError:
        return 0x7F800000 if x > 0 else 0xFF800000


def _s32(v: int) -> int:
    return v - (1 << 32) if v & 0x80000000 else v


@dataclass
class Instr:
    addr: int
    guard: str | None  # "P0", "!P0", "UP1", ... or None
    base: str          # "IMAD"
    mods: tuple        # ("WIDE", "U32")
    args: list


def parse(sass: str) -> list[Instr]:
    out = []
    for m in _LINE.finditer(sass):
        text = m.group(2).strip()
        guard = None
        if text.startswith("@"):
            guard, text = text[1:].split(None, 1)
        op, _, rest = text.partition(" ")
        parts = op.split(".")
        out.append(Instr(int(m.group(1), 16), guard, parts[0], tuple(parts[1:]), _split_args(rest)))
    return out


def _split_args(rest: str) -> list[str]:
    args, depth, cur = [], 0, ""
    for ch in rest:
        depth += ch in "[(" and 1 or (-1 if ch in "])" else 0)
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    args.append(cur.strip())
    return [a for a in args if a]


def mem_width(ins: Instr) -> int:
    """Bytes per lane of a memory instruction."""
    return next((_WIDTH[m] for m in ins.mods if m in _WIDTH), 4)


def is_pred(t: str) -> bool:
    return re.fullmatch(r"!?(U?PT|U?P\d)", t) is not None


@functools.lru_cache(maxsize=None)
def _operand(t: str):
    """(kind, payload, neg, inv, abs) of an operand text; kind in reg, ureg, imm, cbank, sr, none."""
    neg = inv = absv = False
    if t.startswith("-") and not re.match(r"-(0x|\d|INF|QNAN)", t):
        neg, t = True, t[1:]
    if t.startswith("~"):
        inv, t = True, t[1:]
    if t.startswith("|") and t.endswith("|"):
        absv, t = True, t[1:-1]
    t = t.replace(".reuse", "")
    if t in ("RZ", "URZ", "SRZ"):
        return ("imm", 0, neg, inv, absv)
    m = re.fullmatch(r"R(\d+)(\.\w+)?", t)
    if m:
        return ("reg" if m.group(2) in (None, ".64") else "none", int(m.group(1)), neg, inv, absv)
    m = re.fullmatch(r"UR(\d+)(\.64)?", t)
    if m:
        return ("ureg", int(m.group(1)), neg, inv, absv)
    m = re.fullmatch(r"c\[(0x[0-9a-f]+)\]\[(.+)\]", t)
    if m:
        terms = tuple(p.strip() for p in m.group(2).split("+"))
        return ("cbank", (int(m.group(1), 16), terms), neg, inv, absv)
    if re.fullmatch(r"-?0x[0-9a-f]+", t):
        return ("imm", int(t, 16), neg, inv, absv)
    if re.fullmatch(r"[-+]?(\d+\.?\d*(e[-+]?\d+)?|INF|QNAN|NAN)", t):
        return ("imm", _bits(float(t.replace("QNAN", "nan"))), neg, inv, absv)
    m = re.fullmatch(r"SR_(\w+?)(?:\.([XYZ]))?", t)
    if m:
        return ("sr", (m.group(1), "XYZ".index(m.group(2)) if m.group(2) else 0), neg, inv, absv)
    return ("none", None, neg, inv, absv)


class Unknown(Exception):
    """An operand the interpreter does not know."""


@dataclass
class Count:
    """What a launch issues: the sampled blocks simulated, the others counted as the mean sampled interior block."""

    warps: int = 0
    blocks: int = 0
    instructions: float = 0.0       # warp-instructions issued by the launch
    per_warp_min: int = 0
    per_warp_max: int = 0
    memory: Counter = field(default_factory=Counter)   # "LDG.128" -> warp-instructions
    classes: Counter = field(default_factory=Counter)  # alu / memory / cross_lane / control
    lane_slots: float = 0.0          # active, guarded-on lanes summed over issued instructions
    predicated_off: float = 0.0      # instructions issued with the guard false on every active lane
    divergent_branches: float = 0.0  # branches that split a warp
    backward_taken: float = 0.0      # loop trips
    data_branches: int = 0           # branches on unknown values (both sides counted)
    data_branch_sites: set = field(default_factory=set)
    sampled_blocks: int = 0
    exact: bool = True               # every block simulated, or the sampled interior blocks all agreed

    @property
    def lane_use(self) -> float:
        return self.lane_slots / (32 * self.instructions) if self.instructions else 0.0


class _Warp:
    """Registers of one warp: R and P per lane, UR and UP per warp."""

    def __init__(self, const: bytes, ntid, ctaid, tids):
        self.const, self.ntid, self.ctaid, self.tids = const, ntid, ctaid, tids
        self.R: dict[int, list] = {}
        self.P: dict[int, list] = {}
        self.UR: dict[int, object] = {}
        self.UP: dict[int, object] = {}

    def pred(self, text: str, lane: int):
        neg = text.startswith("!")
        t = text.lstrip("!")
        if t in ("PT", "UPT"):
            v = True
        elif t.startswith("UP"):
            v = self.UP.get(int(t[2:]))
        else:
            p = self.P.get(int(t[1:]))
            v = None if p is None else p[lane]
        return v if v is None or not neg else not v

    def set_pred(self, text: str, lane: int, val):
        if text in ("PT", "UPT"):
            return
        if text.startswith("UP"):
            self.UP[int(text[2:])] = val
        else:
            self.P.setdefault(int(text[1:]), [None] * 32)[lane] = val

    def set_reg(self, n: int, lane: int, val):
        if n != 255:
            self.R.setdefault(n, [None] * 32)[lane] = None if val is None else val & M32

    def value(self, text: str, lane: int, width: int = 32):
        kind, x, neg, inv, absv = _operand(text)
        mask = (1 << width) - 1
        if kind == "imm":
            v = x & mask
        elif kind == "reg":
            if x == 255:
                v = 0
            else:
                r = self.R.get(x)
                v = None if r is None else r[lane]
                if width == 64 and v is not None:
                    h = self.R.get(x + 1)
                    v = None if h is None or h[lane] is None else v | (h[lane] << 32)
        elif kind == "ureg":
            v = 0 if x == 63 else self.UR.get(x)
            if width == 64 and v is not None:
                h = 0 if x == 63 else self.UR.get(x + 1)
                v = None if h is None else v | (h << 32)
        elif kind == "cbank":
            bank, terms = x
            addr = 0
            for term in terms:
                if re.fullmatch(r"-?0x[0-9a-f]+", term):
                    addr += int(term, 16)
                else:
                    tv = self.value(term, lane)
                    if tv is None:
                        return None
                    addr += tv
            size = width // 8
            v = int.from_bytes(self.const[addr:addr + size], "little") if bank == 0 and addr + size <= len(
                self.const) else None
        elif kind == "sr":
            name, i = x
            v = {"TID": lambda: self.tids[lane][i], "CTAID": lambda: self.ctaid[i], "LANEID": lambda: lane,
                 "NTID": lambda: self.ntid[i], "EQMASK": lambda: 1 << lane,
                 "LTMASK": lambda: (1 << lane) - 1}.get(name, lambda: None)()
        else:
            v = None
        if v is None:
            return None
        if absv:
            v = abs(_s32(v)) & mask
        if inv:
            v = ~v & mask
        if neg:
            v = -v & mask
        return v


def _dests(ins: Instr) -> list[str]:
    """The registers and predicates an instruction writes."""
    b, a, mods = ins.base, ins.args, ins.mods
    if not a or b in MEMORY and b.startswith("ST") or b in ("RED", "REDG"):
        return []
    out = [a[0]]
    if b in ("ISETP", "FSETP", "HSETP2", "DSETP", "UISETP", "PLOP3", "UPLOP3", "SHFL"):
        out = [a[0], a[1]]
    elif b in ("IADD3", "UIADD3"):
        out += [p for p in a[1:3] if is_pred(p)][: max(0, len(a) - 4)]
    elif b in ("LEA", "ULEA", "LOP3", "ULOP3", "IMAD", "UIMAD") and len(a) > 1 and is_pred(a[1]):
        out.append(a[1])
    n_regs = 4 if "128" in mods else 2 if ("64" in mods or "WIDE" in mods or (b == "CS2R" and "32" not in mods)) \
        else 1
    r = a[0]
    m = re.fullmatch(r"(U?R)(\d+)", r)
    if m and n_regs > 1:
        out[1:1] = [f"{m.group(1)}{int(m.group(2)) + k}" for k in range(1, n_regs)]
    return out


# ---- integer semantics: fn(warp, ins, lane) -> [(dest, value)]; raise Unknown where an input is unknown ----------
def _v(w, t, lane, width=32):
    v = w.value(t, lane, width)
    if v is None:
        raise Unknown
    return v


def _p(w, t, lane):
    v = w.pred(t, lane)
    if v is None:
        raise Unknown
    return v


def _mov(w, ins, lane):
    return [(ins.args[0], _v(w, ins.args[1], lane))]


def _cs2r(w, ins, lane):
    if ins.args[1] != "SRZ":
        raise Unknown
    return [(d, 0) for d in _dests(ins)]


def _ldc(w, ins, lane):
    wide = "64" in ins.mods
    v = _v(w, ins.args[1], lane, 64 if wide else 32)
    if "U8" in ins.mods:
        v &= 0xFF
    d = _dests(ins)
    return [(d[0], v & M32), (d[1], v >> 32)] if wide else [(d[0], v)]


def _imad(w, ins, lane):
    a, mods = ins.args, ins.mods
    i, pout = (2, a[1]) if is_pred(a[1]) else (1, None)
    x, y = _v(w, a[i], lane), _v(w, a[i + 1], lane)
    signed = not ({"U32", "MOV", "SHL", "IADD"} & set(mods))
    carry = (1 if _p(w, a[i + 3], lane) else 0) if "X" in mods and len(a) > i + 3 else 0
    if "WIDE" in mods:
        r = ((_s32(x) * _s32(y)) if signed else x * y) + _v(w, a[i + 2], lane, 64) + carry
        d = _dests(ins)
        return [(d[0], r & M32), (d[1], (r >> 32) & M32)]
    z = _v(w, a[i + 2], lane)
    if "HI" in mods:
        r = (((_s32(x) * _s32(y)) if signed else x * y) >> 32) + z + carry
    else:
        r = x * y + z + carry
    return [(a[0], r & M32)] + ([(pout, bool((r >> 32) & 1))] if pout else [])


def _iadd3(w, ins, lane):
    a = ins.args
    pouts = [p for p in a[1:3] if is_pred(p)][: max(0, len(a) - 4)]
    i = 1 + len(pouts)
    s = sum(_v(w, t, lane) for t in a[i:i + 3])
    if "X" in ins.mods:
        s += sum(1 for p in a[i + 3:] if _p(w, p, lane))
    return [(a[0], s & M32)] + [(p, bool((s >> (32 + k)) & 1)) for k, p in enumerate(pouts)]


def _viadd(w, ins, lane):
    return [(ins.args[0], (_v(w, ins.args[1], lane) + _v(w, ins.args[2], lane)) & M32)]


def _lea(w, ins, lane):
    a, mods = ins.args, ins.mods
    i, pout = (2, a[1]) if is_pred(a[1]) else (1, None)
    if "HI" in mods and "SX32" in mods:
        r = ((_s32(_v(w, a[i], lane)) << _v(w, a[i + 2], lane)) >> 32) + _v(w, a[i + 1], lane)
        rest = a[i + 3:]
    elif "HI" in mods:
        x = _v(w, a[i], lane) | (_v(w, a[i + 2], lane) << 32)
        r = ((x << _v(w, a[i + 3], lane)) >> 32) + _v(w, a[i + 1], lane)
        rest = a[i + 4:]
    else:
        r = ((_v(w, a[i], lane) << _v(w, a[i + 2], lane)) & M32) + _v(w, a[i + 1], lane)
        rest = a[i + 3:]
    if "X" in mods:
        r += sum(1 for p in rest if is_pred(p) and _p(w, p, lane))
    return [(a[0], r & M32)] + ([(pout, bool((r >> 32) & 1))] if pout else [])


def _lut3(x, y, z, lut):
    r = 0
    for k in range(8):
        if (lut >> k) & 1:
            r |= (x if k & 4 else ~x) & (y if k & 2 else ~y) & (z if k & 1 else ~z)
    return r & M32


def _lop3(w, ins, lane):
    a = ins.args
    i, pout = (2, a[1]) if is_pred(a[1]) else (1, None)
    r = _lut3(*(_v(w, t, lane) for t in a[i:i + 3]), _v(w, a[i + 3], lane))
    return [(a[0], r)] + ([(pout, r != 0)] if pout else [])


def _plop3(w, ins, lane):
    a = ins.args
    x, y, z = (_p(w, t, lane) for t in a[2:5])
    k = (4 if x else 0) | (2 if y else 0) | (1 if z else 0)
    lut2 = _v(w, a[6], lane) if len(a) > 6 else 0
    return [(a[0], bool((_v(w, a[5], lane) >> k) & 1)), (a[1], bool((lut2 >> k) & 1))]


def _shf(w, ins, lane):
    a, mods = ins.args, ins.mods
    x, s, c = _v(w, a[1], lane), _v(w, a[2], lane), _v(w, a[3], lane)
    is64 = "U64" in mods or "S64" in mods
    s = s & 63 if "W" in mods else min(s, 63 if is64 else 32)
    full = ((_s32(c) if ("S32" in mods or "S64" in mods) else c) << 32) | x
    y = full << s if "L" in mods else full >> s
    return [(a[0], ((y >> 32) if "HI" in mods else y) & M32)]


def _isetp(w, ins, lane):
    a, mods = ins.args, ins.mods
    cmp, bop = mods[0], next(m for m in mods if m in ("AND", "OR", "XOR"))
    x, y = _v(w, a[2], lane), _v(w, a[3], lane)
    if "U32" not in mods:
        x, y = _s32(x), _s32(y)
    p = _p(w, a[4], lane)
    ops = {"LT": x < y, "LE": x <= y, "GT": x > y, "GE": x >= y, "EQ": x == y, "NE": x != y}
    if "EX" in mods:  # the high words; a[5] is the low words' result
        low = _p(w, a[5], lane)
        if cmp == "EQ":
            r = x == y and low
        elif cmp == "NE":
            r = x != y or low
        else:
            r = (x < y if cmp in ("LT", "LE") else x > y) or (x == y and low)
    else:
        r = ops[cmp]
    f = {"AND": lambda u, v: u and v, "OR": lambda u, v: u or v, "XOR": lambda u, v: u != v}[bop]
    return [(a[0], f(r, p)), (a[1], f(not r, p))]


def _sel(w, ins, lane):
    a = ins.args
    return [(a[0], _v(w, a[1] if _p(w, a[3], lane) else a[2], lane))]


def _mnmx(w, ins, lane):
    a, mods = ins.args, ins.mods
    if {"U16x2", "S16x2", "RELU"} & set(mods):
        raise Unknown
    vals = [_v(w, t, lane) for t in a[1:-1]]
    if "U32" not in mods:
        vals = [_s32(v) for v in vals]
    return [(a[0], (min(vals) if _p(w, a[-1], lane) else max(vals)) & M32)]


def _prmt(w, ins, lane):
    a = ins.args
    if ins.mods:
        raise Unknown
    src = _v(w, a[1], lane) | (_v(w, a[3], lane) << 32)
    sel = _v(w, a[2], lane)
    r = 0
    for k in range(4):
        nib = (sel >> (4 * k)) & 0xF
        byte = (src >> (8 * (nib & 7))) & 0xFF
        r |= ((0xFF if byte & 0x80 else 0) if nib & 8 else byte) << (8 * k)
    return [(a[0], r)]


def _flo(w, ins, lane):
    x = _v(w, ins.args[-1], lane)
    if "U32" not in ins.mods and x & 0x80000000:
        x = ~x & M32
    r = x.bit_length() - 1 if x else M32
    return [(ins.args[0], (31 - r if "SH" in ins.mods and x else r) & M32)]


def _popc(w, ins, lane):
    return [(ins.args[0], bin(_v(w, ins.args[-1], lane)).count("1"))]


def _brev(w, ins, lane):
    return [(ins.args[0], int(f"{_v(w, ins.args[-1], lane):032b}"[::-1], 2))]


def _iabs(w, ins, lane):
    return [(ins.args[0], abs(_s32(_v(w, ins.args[1], lane))) & M32)]


def _sgxt(w, ins, lane):
    x, n = _v(w, ins.args[1], lane), min(_v(w, ins.args[2], lane), 32)
    x &= (1 << n) - 1
    if n and "U32" not in ins.mods and x >> (n - 1):
        x -= 1 << n
    return [(ins.args[0], x & M32)]


def _bmsk(w, ins, lane):
    pos, n = _v(w, ins.args[1], lane), _v(w, ins.args[2], lane)
    return [(ins.args[0], (((1 << min(n, 32)) - 1) << min(pos, 32)) & M32)]


# float ops, evaluated where every input is known (the float reciprocal in integer division sequences)
def _fval(w, t, lane):
    kind, x, neg, inv, absv = _operand(t)
    v = w.value(t.lstrip("-").strip("|"), lane)
    if v is None:
        raise Unknown
    f = _f32(v)
    f = abs(f) if absv else f
    return -f if neg else f


def _fop(fn):
    def op(w, ins, lane):
        if any(m.startswith("H") or m.endswith("x2") for m in ins.mods):
            raise Unknown
        return [(ins.args[0], _bits(fn(*(_fval(w, t, lane) for t in ins.args[1:] if not is_pred(t)))))]
    return op


def _rn(x: float) -> float:
    return _f32(_bits(x)) if math.isfinite(x) else x


def _i2f(w, ins, lane):
    x = _v(w, ins.args[-1], lane)
    if not {"U32", "U64"} & set(ins.mods):
        x = _s32(x)
    r = _rn(float(x))
    if "RP" in ins.mods and r < x:
        r = _rn(math.nextafter(r, math.inf))
    return [(ins.args[0], _bits(r))]


def _f2i(w, ins, lane):
    f = _f32(_v(w, ins.args[-1], lane))
    if not math.isfinite(f):
        raise Unknown
    v = math.trunc(f) if "TRUNC" in ins.mods else round(f)
    if "U32" in ins.mods:
        v = max(0, min(v, M32))
    return [(ins.args[0], v & M32)]


def _mufu(w, ins, lane):
    f = _f32(_v(w, ins.args[-1], lane))
    if "RCP" not in ins.mods or f == 0:
        raise Unknown
    return [(ins.args[0], _bits(_rn(1.0 / f)))]


OPS = {
    "MOV": _mov, "MOV32I": _mov, "S2R": _mov, "S2UR": _mov, "R2UR": _mov, "CS2R": _cs2r, "LDC": _ldc,
    "IMAD": _imad, "IADD3": _iadd3, "VIADD": _viadd, "LEA": _lea, "LOP3": _lop3, "PLOP3": _plop3, "SHF": _shf,
    "ISETP": _isetp, "SEL": _sel, "FSEL": _sel, "IMNMX": _mnmx, "VIMNMX": _mnmx, "VIMNMX3": _mnmx, "PRMT": _prmt,
    "FLO": _flo, "POPC": _popc, "BREV": _brev, "IABS": _iabs, "SGXT": _sgxt, "BMSK": _bmsk,
    "I2F": _i2f, "I2FP": _i2f, "F2I": _f2i, "MUFU": _mufu, "FFMA": _fop(lambda x, y, z: _rn(x * y + z)),
    "FMUL": _fop(lambda x, y: _rn(x * y)), "FADD": _fop(lambda x, y: _rn(x + y)),
}


def _uniform_base(ins: Instr) -> str | None:
    """The plain op of a uniform-datapath instruction (UIADD3 -> IADD3), or None."""
    if ins.base.startswith("U") and ins.args and re.match(r"!?U(R|P)", ins.args[0]):
        return ins.base[1:]
    if ins.base in ("S2UR", "R2UR"):
        return ins.base
    return None


class Kernel:
    """One kernel's SASS, ready to simulate."""

    def __init__(self, sass: str):
        self.code = parse(sass)
        if not self.code:
            raise ValueError("no SASS instructions")
        self.index = {ins.addr: i for i, ins in enumerate(self.code)}

    def run_warp(self, const: bytes, ntid, ctaid, warp_id: int, stats: Count, max_steps: int = 500000) -> int:
        """Simulate one warp, adding to ``stats``; returns the warp-instructions it issued."""
        nt = ntid[0] * ntid[1] * ntid[2]
        ids = [warp_id * 32 + i for i in range(32)]
        tids = [(t % ntid[0], (t // ntid[0]) % ntid[1], t // (ntid[0] * ntid[1])) for t in ids]
        live = frozenset(i for i in range(32) if ids[i] < nt)
        if not live:
            return 0
        w = _Warp(const, ntid, ctaid, tids)
        runnable = [(0, live, ())]  # (pc, lanes, call stack)
        parked: dict[tuple, list] = {}  # (barrier, pc) -> [(lanes, stack)]
        barrier: dict[str, dict[int, frozenset]] = {}  # barrier register -> lane -> its participants
        exited: set = set()
        issued = steps = 0
        while runnable or parked:
            if not runnable:  # release the barrier whose participants have all arrived or exited
                key = min(parked, key=lambda k: k[1])
                group = parked.pop(key)
                runnable.append((key[1] + 1, frozenset().union(*(g[0] for g in group)), group[0][1]))
                continue
            pc, mask, stack = runnable.pop()
            while mask:
                steps += 1
                if steps > max_steps:
                    raise RuntimeError("the warp did not finish: a loop on an unknown value?")
                if pc >= len(self.code):
                    break
                ins = self.code[pc]
                issued += 1
                b = ins.base
                on = {i: True for i in mask} if ins.guard is None else {i: w.pred(ins.guard, i) for i in mask}
                n_on = sum(1 for v in on.values() if v)
                stats.lane_slots += n_on
                if not any(v is not False for v in on.values()):
                    stats.predicated_off += 1
                ub = _uniform_base(ins)
                stats.classes["memory" if b in MEMORY else "control" if b in CONTROL else
                              "cross_lane" if b in CROSS_LANE else "alu"] += 1
                if b in MEMORY:
                    kind = b if b in ("LDG", "STG", "LDS", "STS") else b
                    stats.memory[f"{kind}.{8 * mem_width(ins)}"] += 1
                if b == "EXIT":
                    gone = {i for i in mask if on[i] is not False}
                    exited |= gone
                    mask = mask - gone
                    pc += 1
                    continue
                if b in ("BRA", "JMP"):
                    target = self.index[int(ins.args[-1], 16)]
                    if len(ins.args) > 1:  # BRA.U UP0, target / BRA.DIV URx, target
                        if "DIV" in ins.mods:
                            div = len(mask) < len(live - exited)
                            on = {i: (on[i] and div) for i in mask}
                        else:
                            on = {i: (on[i] if on[i] is not True else w.pred(ins.args[0], i)) for i in mask}
                    taken = frozenset(i for i in mask if on[i] is not False)
                    fall = frozenset(i for i in mask if on[i] is not True)
                    if taken & fall:
                        stats.data_branches += 1
                        stats.data_branch_sites.add(ins.addr)
                    if taken and fall:
                        if not (taken & fall):
                            stats.divergent_branches += 1
                        runnable.append((target, taken, stack))
                        mask, pc = fall, pc + 1
                    elif taken:
                        if target <= pc:
                            stats.backward_taken += 1
                        pc = target
                    else:
                        pc += 1
                    continue
                if b == "BSSY":
                    for i in mask:
                        barrier.setdefault(ins.args[0], {})[i] = mask
                    pc += 1
                    continue
                if b == "BSYNC":
                    name = ins.args[0]
                    need = frozenset().union(*(barrier.get(name, {}).get(i, frozenset([i])) for i in mask))
                    key = (name, pc)
                    group = parked.setdefault(key, [])
                    group.append((mask, stack))
                    have = frozenset().union(*(g[0] for g in group))
                    # released once no other context can still bring a participant here (after a branch on an
                    # unknown value both sides hold the same lanes)
                    if not any(r[1] & need for r in runnable):
                        del parked[key]
                        mask, pc = have, pc + 1
                        continue
                    break
                if b == "CALL":
                    stack = stack + (pc + 1,)
                    pc = self.index[int(ins.args[-1], 16)]
                    continue
                if b == "RET":
                    if not stack:
                        break
                    pc, stack = stack[-1], stack[:-1]
                    continue
                self._execute(w, ins, ub, on, mask)
                pc += 1
        return issued

    def _execute(self, w: _Warp, ins: Instr, ub, on: dict, mask):
        b = ins.base
        if b == "SHFL":
            return self._shfl(w, ins, on, mask)
        if b in ("VOTE", "VOTEU"):
            return self._vote(w, ins, on, mask)
        if b == "ELECT":
            first = min(mask)
            for i in mask:
                w.set_pred(ins.args[0], i, i == first)
            return
        dests = _dests(ins)
        if not dests:
            return
        fn = OPS.get(ub if ub else b)
        lanes = [min(mask)] if ub else list(mask)
        for lane in lanes:
            g = on[lane]
            if g is False:
                continue
            res = None
            if fn is not None and g is True:
                try:
                    res = fn(w, ins, lane)
                except (Unknown, ValueError, IndexError, KeyError, StopIteration):
                    res = None
            for d, v in (res if res is not None else [(d, None) for d in dests]):
                _write(w, d, lane, v)

    @staticmethod
    def _shfl(w: _Warp, ins: Instr, on: dict, mask):
        pout, dest, src, bt, ct = ins.args[:5]
        vals = [w.value(src, i) for i in range(32)]
        mode = ins.mods[0] if ins.mods else "IDX"
        out = {}
        for i in mask:
            if on[i] is False:
                continue
            bb, cc = w.value(bt, i), w.value(ct, i)
            if bb is None or cc is None or on[i] is None:
                out[i] = None
                continue
            seg = (cc >> 8) & 0x1F
            lo = i & seg
            hi = lo | (cc & 0x1F & ~seg)
            j, ok = {"IDX": (lo | (bb & ~seg & 0x1F), True), "UP": (i - bb, i - bb >= hi),
                     "DOWN": (i + bb, i + bb <= hi), "BFLY": (i ^ bb, (i ^ bb) <= hi)}[mode]
            if mode == "IDX":
                ok = j <= hi
            j = j if ok and 0 <= j < 32 else i
            out[i] = vals[j] if j in mask else None
        for i, v in out.items():
            _write(w, dest, i, v)
            _write(w, pout, i, None)

    @staticmethod
    def _vote(w: _Warp, ins: Instr, on: dict, mask):
        a = ins.args
        mode = ins.mods[0] if ins.mods else "ANY"
        srcs = {i: (w.pred(a[-1], i) if on[i] else False) for i in mask}
        known = all(v is not None for v in srcs.values())
        ballot = sum(1 << i for i, v in srcs.items() if v) if known else None
        for i in mask:
            if re.match(r"U?R", a[0]):
                _write(w, a[0], i, ballot)
            pd = a[1] if re.match(r"U?R", a[0]) else a[0]
            pv = None if not known else (bool(ballot) if mode == "ANY" else all(srcs.values()) if mode == "ALL"
                                         else None)
            _write(w, pd, i, pv)


def _write(w: _Warp, dest: str, lane: int, val):
    d = dest.lstrip("!")
    if d in ("RZ", "URZ", "PT", "UPT"):
        return
    if is_pred(d):
        w.set_pred(d, lane, val)
    elif d.startswith("UR"):
        w.UR[int(d[2:])] = None if val is None else val & M32
    elif d.startswith("R"):
        w.set_reg(int(re.match(r"R(\d+)", d).group(1)), lane, val)


def launch_counts(kernel: Kernel, grid, block, params: bytes, *, sample_blocks: int = 6) -> Count:
    """Simulate blocks of a launch and scale to all of them: every block when there are at most
    ``sample_blocks + 2``, else the first, the last and ``sample_blocks`` evenly spaced between them; each block
    not simulated counts as the mean of the sampled interior ones (``exact`` False where those disagree)."""
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    bx, by, bz = (tuple(block) + (1, 1))[:3]
    const = bytearray(PARAM_BASE + len(params))
    struct.pack_into("<6I", const, 0, bx, by, bz, gx, gy, gz)
    const[PARAM_BASE:] = params
    const = bytes(const)
    nblocks = gx * gy * gz
    wpb = (bx * by * bz + 31) // 32
    if nblocks <= sample_blocks + 2:
        picks = list(range(nblocks))
    else:
        step = (nblocks - 1) / (sample_blocks + 1)
        picks = sorted({0, nblocks - 1, *(round(step * (k + 1)) for k in range(sample_blocks))})
    total = Count(warps=nblocks * wpb, blocks=nblocks, sampled_blocks=len(picks))
    per_block = {}
    per_warp = []
    for blk in picks:
        s = Count()
        ctaid = (blk % gx, (blk // gx) % gy, blk // (gx * gy))
        for wid in range(wpb):
            n = kernel.run_warp(const, (bx, by, bz), ctaid, wid, s)
            s.instructions += n
            per_warp.append(n)
        per_block[blk] = s
    interior = [per_block[b] for b in picks if b not in (0, nblocks - 1)] or list(per_block.values())
    missing = nblocks - len(picks)
    scaled = list(per_block.values()) + [_scaled(s, missing / len(interior)) for s in interior] if missing else \
        list(per_block.values())
    for s in scaled:
        total.instructions += s.instructions
        total.memory.update(s.memory)
        total.classes.update(s.classes)
        total.lane_slots += s.lane_slots
        total.predicated_off += s.predicated_off
        total.divergent_branches += s.divergent_branches
        total.backward_taken += s.backward_taken
    total.data_branches = sum(s.data_branches for s in per_block.values())
    total.exact = not missing or len({s.instructions for s in interior}) == 1
    total.per_warp_min, total.per_warp_max = min(per_warp), max(per_warp)
    return total


def _scaled(s: Count, f: float) -> Count:
    return Count(instructions=s.instructions * f, memory=Counter({k: v * f for k, v in s.memory.items()}),
                 classes=Counter({k: v * f for k, v in s.classes.items()}), lane_slots=s.lane_slots * f,
                 predicated_off=s.predicated_off * f, divergent_branches=s.divergent_branches * f,
                 backward_taken=s.backward_taken * f)
