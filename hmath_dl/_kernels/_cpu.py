"""The machine policy: the one place that knows which CPU the kernels are compiled for.

Numba compiles for its *target*: the CPU named by ``NUMBA_CPU_NAME`` (with the features of
``NUMBA_CPU_FEATURES`` when that is set too), else the host.  :func:`machine` reads that
target once and describes it -- vector width, number of vector registers, FMA, AVX-512
VNNI/BF16 -- and every CPU-specific choice in the package asks it (the convolution
micro-kernels, the int8 GEMM, the reduced-precision GEMM); no other module detects
anything.

``HMATH_DL_KERNELS=portable`` (read once, with the rest of the configuration) forces the
portable kernels everywhere: same bits, plainer code -- for tests and bug reports.

The description follows numba exactly: the features are ``NUMBA_CPU_FEATURES`` when set,
none for ``NUMBA_CPU_NAME=generic`` (numba's own default there: baseline x86-64), else the
host's (numba keeps the host's features with any other ``NUMBA_CPU_NAME``), so the policy
never assumes an instruction the compiled code may not have, nor misses one it has.
On a target without AVX2+FMA (aarch64, baseline x86-64) the portable kernels run.
:func:`target_environment` gives the variables that compile for AVX2 or baseline x86-64
on a bigger host.  Every path
computes the same terms in the same order, so the choice changes speed, never bits.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from functools import cached_property, lru_cache

__all__ = ["Machine", "machine", "describe", "target_environment", "named_target_note"]

@dataclass(frozen=True)
class Machine:
    """What the kernels may assume about the CPU they are compiled for.

    ``vector_bits`` / ``f64_lanes`` / ``vector_registers`` describe the widest vector
    registers the micro-kernels use (512/8/32 with AVX-512, 256/4/16 with AVX2, 128/2/16
    for baseline x86-64 and aarch64 NEON); ``tiled`` says whether register-tiled float64
    micro-kernels are emitted at all (it needs FMA and at least 4 lanes)."""

    arch: str
    cpu: str
    source: str
    features: frozenset
    portable: bool

    def has(self, *names: str) -> bool:
        """Whether the target has every LLVM feature in ``names``."""
        return all(n in self.features for n in names)

    # --- what the target has (descriptive; ``portable`` does not change these) ---------
    @property
    def fma(self) -> bool:
        return self.has("fma") or self.arch == "aarch64"

    @cached_property
    def vector_bits(self) -> int:
        if self.has("avx512f"):
            return 512
        if self.has("avx"):
            return 256
        return 128

    @property
    def f64_lanes(self) -> int:
        return self.vector_bits // 64

    @property
    def vector_registers(self) -> int:
        return 32 if self.has("avx512f") or self.arch == "aarch64" else 16

    # --- what the kernels use (``portable`` turns every special path off) ----------------
    @cached_property
    def isa(self) -> str:
        """The micro-kernel family the kernels use: ``avx512``, ``avx2`` or ``portable``."""
        if self.portable or self.arch != "x86_64":
            return "portable"
        if self.has("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"):
            return "avx512"
        if self.has("avx2", "fma"):
            return "avx2"
        return "portable"

    @property
    def avx512(self) -> bool:
        """The AVX-512 micro-kernels run."""
        return self.isa == "avx512"

    @property
    def avx2(self) -> bool:
        """The AVX2 (or wider) micro-kernels run."""
        return self.isa in ("avx2", "avx512")

    @property
    def avx512_vnni(self) -> bool:
        """The AVX-512 VNNI int8 kernel runs."""
        return self.avx512 and self.has("avx512vnni")

    @property
    def avx512_bf16(self) -> bool:
        return self.avx512 and self.has("avx512bf16")

    @property
    def f16c(self) -> bool:
        """FP16 -> float conversions in hardware are used (x86 F16C; aarch64 has them).
        Elsewhere LLVM lowers them to a runtime helper call that Numba does not link."""
        if self.portable:
            return False
        return self.has("f16c") if self.arch == "x86_64" else self.arch == "aarch64"

    @property
    def tiled(self) -> bool:
        """Whether register-tiled float64 micro-kernels run (elsewhere the generic kernels,
        same bits)."""
        return self.isa != "portable"

    def summary(self) -> str:
        extra = [n for n in ("avx512_vnni", "avx512_bf16") if getattr(self, n)]
        forced = ", forced by HMATH_DL_KERNELS" if self.portable else ""
        s = (f"{self.isa} (target {self.cpu} from {self.source}{forced}; {self.f64_lanes} "
             f"float64 lanes, {self.vector_registers} vector registers, "
             f"fma={'yes' if self.fma else 'no'}")
        return s + "".join(", " + e for e in extra) + ")"


def _parse_features(text: str):
    return frozenset(f[1:] for f in text.split(",") if f.startswith("+"))


def _arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(m, m)


def _host_features():
    import llvmlite.binding as llb
    return frozenset(k for k, v in llb.get_host_cpu_features().items() if v)


def _read(portable: bool) -> Machine:
    """Describe what numba compiles for, exactly as numba decides it: the CPU name is
    ``NUMBA_CPU_NAME`` or the host's, the features numba's ``config.CPU_FEATURES`` --
    ``NUMBA_CPU_FEATURES``, or for ``NUMBA_CPU_NAME=generic`` none at all (baseline
    x86-64) -- or, when that is None (even when a CPU name is given), the HOST's (numba
    passes the host feature string along with any other ``NUMBA_CPU_NAME``; to compile for
    e.g. AVX2 on an AVX-512 host set both, see :func:`target_environment`)."""
    from numba.core import config
    arch = _arch()
    cpu_name = getattr(config, "CPU_NAME", None)
    cpu_features = getattr(config, "CPU_FEATURES", None)
    if cpu_name:
        cpu, src = cpu_name, "NUMBA_CPU_NAME"
    else:
        import llvmlite.binding as llb
        cpu, src = llb.get_host_cpu_name(), "host"
    if cpu_features is not None:
        # numba's own default for NUMBA_CPU_NAME=generic is the empty feature string
        # (baseline x86-64), not the host's: "" is a feature list, not "unset" (read as
        # unset, the policy had emitted AVX-512 intrinsics that LLVM cannot select for
        # that target, and the process aborted)
        feats = _parse_features(cpu_features)
        src += " + NUMBA_CPU_FEATURES" if os.environ.get("NUMBA_CPU_FEATURES") else ""
    else:
        feats = _host_features()
    return Machine(arch=arch, cpu=cpu, source=src, features=feats, portable=portable)


#: LLVM features of the x86-64 micro-architecture levels used to compile for a CPU this
#: host can execute: baseline x86-64 ("generic") and x86-64-v3 (AVX2 + FMA, "haswell").
_BASELINE = ("64bit", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2")
_LEVEL_FEATURES = {
    "generic": _BASELINE,
    "haswell": _BASELINE + ("avx", "avx2", "bmi", "bmi2", "cx16", "f16c", "fma", "lzcnt",
                            "movbe", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3",
                            "xsave"),
}


def target_environment(name: str) -> dict:
    """``{"NUMBA_CPU_NAME": name, "NUMBA_CPU_FEATURES": ...}`` that make numba compile
    for ``name`` (``"haswell"``: AVX2 + FMA, 16 ymm registers; ``"generic"``: baseline
    x86-64) on this host: every host feature outside that level is switched off
    explicitly (``NUMBA_CPU_NAME`` alone keeps the host's features).  For tests and
    benchmarks in a separate process; the host must be able to run the level."""
    if name not in _LEVEL_FEATURES:
        raise ValueError(f"unknown target level {name!r} (expected one of "
                         f"{sorted(_LEVEL_FEATURES)})")
    keep = set(_LEVEL_FEATURES[name])
    feats = sorted(keep | _host_features())
    text = ",".join(("+" if f in keep else "-") + f for f in feats)
    return {"NUMBA_CPU_NAME": name, "NUMBA_CPU_FEATURES": text}


@lru_cache(maxsize=None)
def _machine(portable: bool) -> Machine:
    return _read(portable)


_CONFIG = []      # the hmath_dl.config module, once imported (it imports this module)


def named_target_note(m: Machine):
    """The notice for a ``NUMBA_CPU_NAME`` of a known level (``haswell``) given without
    ``NUMBA_CPU_FEATURES`` on a host with wider vectors, or None.  Numba then compiles
    with the HOST's features under that name (it does so for every name but ``generic``),
    so e.g. ``NUMBA_CPU_NAME=haswell`` alone on an AVX-512 host builds AVX-512 kernels,
    not AVX2 ones -- easy to mistake for an AVX2 measurement."""
    if m.source != "NUMBA_CPU_NAME" or m.cpu not in _LEVEL_FEATURES or m.cpu == "generic":
        return None
    extra = sorted(f for f in ("avx512f", "avx2", "fma")
                   if m.has(f) and f not in _LEVEL_FEATURES[m.cpu])
    if not extra:
        return None
    return (f"hmath_dl: NUMBA_CPU_NAME={m.cpu} without NUMBA_CPU_FEATURES: numba compiles "
            f"with this host's features ({', '.join(extra)} included), not {m.cpu}'s; for "
            f"{m.cpu} code set both: env $(python -m hmath_dl.info --env {m.cpu}) ... "
            f"(HMATH_DL_QUIET=1 hides this line)")


def machine() -> Machine:
    """The target description (read once per process; ``HMATH_DL_KERNELS=portable``
    forces the portable kernels; the setting is looked up on every call, so tests can
    change it).  Facades ask on every call: an attribute lookup and a cached call, no
    import statement.  The first call prints :func:`named_target_note`, if any, to
    stderr (unless ``HMATH_DL_QUIET``)."""
    if not _CONFIG:
        from .. import config
        _CONFIG.append(config)
        note = named_target_note(_machine(False))
        if note and not config.QUIET:
            print(note, file=sys.stderr)
    return _machine(_CONFIG[0].KERNELS == "portable")


def describe() -> str:
    """One line for bug reports (``python -m hmath_dl.info``)."""
    return machine().summary()
