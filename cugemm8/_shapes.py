"""GEMM shapes: the DeepSeek-V3 (N, K) table, the :class:`Shape` record, the
shapes ``cugemm8 check`` runs, and the parser of shapes files (``cugemm8
warmup`` / ``cugemm8 configs``).

This is the one place the DeepSeek-V3 table is written; the command line, the
benchmarks and the tests import it from here (``cugemm8.cli`` re-exports it).
Pure Python: nothing here needs NumPy, CuPy or a GPU.

Shapes files
------------
Either a JSON list of objects ``{"kind", "m", "n", "k", "num_groups"}``
(``kind`` defaults to ``normal``, ``num_groups`` to 1) or text with one shape
per line, ``kind m n k [num_groups]``, where blank lines and everything after
a ``#`` are ignored::

    # kind        m     n      k      groups
    normal        64    2112   7168
    contiguous    8192  4096   7168   4
    masked        256   7168   2048   4
    wgrad         7168  2048   4096
    k_grouped     4096  7168   32768  4

``m`` is the rows of A for ``normal``, m_sum (all groups, each padded to 128
rows) for ``contiguous`` and expected_m for ``masked``: the values the kernel
configuration is chosen from.  The training kinds (:data:`KINDS_1D1D`) give
the FP32 output ``[m, n]`` (per group) and ``k`` tokens (in all).  A file is JSON when its first non-blank
character is ``[``.  Instead of a file, a preset names a list: ``@check`` /
``@check-quick`` (the shapes ``cugemm8 check`` (``--quick``) runs),
``@normal``, ``@decode`` and ``@grouped`` (the benchmark tables; see
:func:`preset_shapes`).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

#: DeepSeek-V3 (N, K) of the normal-GEMM table (docs/benchmarks.md).  The
#: benchmarks' DeepGEMM anchors cover the first six (``DEEPSEEK_NK[:6]``).
DEEPSEEK_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384),
               (4096, 7168), (7168, 2048), (576, 7168))

#: M values ``cugemm8 check`` runs for every (N, K).
CHECK_MS = (1, 64, 128, 4096)

#: Group sizes of ``cugemm8 check``'s grouped shapes are drawn in
#: [lo, hi] * m (``make_operands(..., vary=True)``).
GROUP_SIZE_SPREAD = (0.7, 1.3)

#: Rows each contiguous group is padded to.
GROUP_ALIGN = 128

KINDS = ("normal", "contiguous", "masked")
#: The training kinds (the 1D1D FP32-out kernel, ``cuda_src/fp8_gemm_1d1d.cuh``):
#: ``wgrad`` (``cugemm8.fp8_gemm_nt`` with an FP32 ``d``: D ``[m, n]`` over K
#: = ``k`` tokens) and ``k_grouped`` (``k_grouped_fp8_gemm_nt_contiguous``:
#: ``num_groups`` outputs ``[m, n]``, ``k`` the total tokens, a multiple of
#: 128).  Shapes files, ``cugemm8 warmup``, ``configs``, ``check`` and
#: ``tune`` take them.
KINDS_1D1D = ("wgrad", "k_grouped")
ALL_KINDS = KINDS + KINDS_1D1D


@dataclasses.dataclass(frozen=True)
class Shape:
    """One GEMM problem.

    ``m`` is the rows of A for ``normal`` and ``m_max`` (= expected_m) for
    ``masked``.  For ``contiguous`` it is the rows per group in
    :func:`check_shapes` and the test data (m_sum = num_groups * m when
    every group has exactly m rows), but m_sum in a shapes file
    (:func:`load_shapes`), where it picks the kernel configuration.
    """
    kind: str
    m: int
    n: int
    k: int
    num_groups: int = 1

    def label(self) -> str:
        dims = f"{self.m}x{self.n}x{self.k}"
        return dims if self.kind in ("normal", "wgrad") else f"{self.num_groups}x{dims}"


#: Tokens of ``cugemm8 check``'s weight-gradient shapes.
CHECK_TOKENS = 4096


def check_shapes(quick: bool = False) -> list[Shape]:
    """The shapes ``cugemm8 check`` runs (``quick``: a handful): the normal
    GEMMs, one contiguous and one masked grouped shape, and the training
    GEMMs (``wgrad`` of the six DeepSeek-V3 layers at :data:`CHECK_TOKENS`
    tokens, one ``k_grouped`` MoE weight gradient)."""
    if quick:
        normal = [Shape("normal", m, n, k) for m, n, k in
                  ((1, 2112, 7168), (64, 7168, 2048), (128, 576, 7168), (4096, 4096, 7168))]
        training = [Shape("wgrad", 7168, 2048, CHECK_TOKENS), Shape("k_grouped", 2048, 1024, 4 * 1024, 4)]
    else:
        normal = [Shape("normal", m, n, k) for m in CHECK_MS for n, k in DEEPSEEK_NK]
        training = ([Shape("wgrad", n, k, CHECK_TOKENS) for n, k in DEEPSEEK_NK[:6]]
                    + [Shape("k_grouped", 4096, 7168, 4 * 2048, 4)])
    return normal + [Shape("contiguous", 1024, 4096, 7168, 4), Shape("masked", 256, 7168, 2048, 4)] + training


def contiguous_m_sums(m: int, num_groups: int) -> list[int]:
    """Every m_sum ``check``'s varied group sizes can give for ``m`` rows per
    group: each group holds round(f * m) rows, f in :data:`GROUP_SIZE_SPREAD`,
    padded to :data:`GROUP_ALIGN`."""
    lo, hi = GROUP_SIZE_SPREAD

    def padded(rows: int) -> int:
        return -(-max(1, rows) // GROUP_ALIGN) * GROUP_ALIGN

    first, last = padded(round(lo * m)), padded(round(hi * m))
    return list(range(num_groups * first, num_groups * last + 1, GROUP_ALIGN))


#: Names accepted instead of a shapes file.
PRESETS = ("@check", "@check-quick", "@normal", "@decode", "@grouped")

#: M of the normal-GEMM benchmark table (``@normal``: benches/bench_gemm.py)
#: and of the decode table (``@decode``: benches/bench_decode.py).
NORMAL_MS = (64, 128, 4096)
DECODE_MS = (1, 2, 4, 8, 16, 32, 64, 128)
#: The grouped benchmark shapes (benches/bench_gemm.py): (num_groups, rows
#: per group, n, k); ``@grouped`` lists them with m = m_sum (contiguous) and
#: expected_m (masked).
CONTIGUOUS_TABLE = ((4, 8192, 4096, 7168), (4, 8192, 7168, 2048),
                    (8, 4096, 4096, 7168), (8, 4096, 7168, 2048))
MASKED_TABLE = ((1, 1024, 4096, 7168), (1, 1024, 7168, 2048), (2, 512, 4096, 7168),
                (2, 512, 7168, 2048), (4, 256, 4096, 7168), (4, 256, 7168, 2048),
                (16, 64, 4096, 7168), (16, 64, 7168, 2048), (32, 32, 4096, 7168))


def preset_shapes(name: str) -> list[Shape]:
    """The shapes of a preset (warmup semantics: contiguous ``m`` = m_sum):

    * ``@check`` / ``@check-quick``: those ``cugemm8 check`` (``--quick``)
      runs: its normal, masked and training shapes, and every m_sum its
      contiguous shape can reach;
    * ``@normal``: the 18 normal shapes of the benchmark table (M = 64, 128,
      4096 on the six DeepSeek-V3 (N, K) pairs of ``DEEPSEEK_NK[:6]``);
    * ``@decode``: the 48 decode shapes (M = 1 ... 128, powers of two, on the
      same six pairs);
    * ``@grouped``: the benchmark table's contiguous and masked shapes.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    if name in ("@normal", "@decode"):
        ms = NORMAL_MS if name == "@normal" else DECODE_MS
        return [Shape("normal", m, n, k) for m in ms for n, k in DEEPSEEK_NK[:6]]
    if name == "@grouped":
        return ([Shape("contiguous", g * m, n, k, g) for g, m, n, k in CONTIGUOUS_TABLE]
                + [Shape("masked", m, n, k, g) for g, m, n, k in MASKED_TABLE])
    out = []
    for s in check_shapes(quick=name == "@check-quick"):
        if s.kind == "contiguous":
            out += [Shape(s.kind, ms, s.n, s.k, s.num_groups) for ms in contiguous_m_sums(s.m, s.num_groups)]
        else:
            out.append(s)
    return out


def _validate(where: str, kind, vals, item) -> Shape:
    if kind not in ALL_KINDS:
        raise ValueError(f"{where}: kind must be one of {', '.join(ALL_KINDS)}, got {kind!r}")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in vals):
        raise ValueError(f"{where}: m, n, k, num_groups must be integers, got {item}")
    m, n, k, g = vals
    # The rules the ops themselves enforce (cugemm8.gemm).
    if m < 0 or g < 1 or n <= 0 or n % 8 or k <= 0 or k % 16:
        raise ValueError(f"{where}: need m >= 0, num_groups >= 1, n a positive multiple of 8 "
                         f"and k a positive multiple of 16, got {item}")
    if kind == "k_grouped" and k % 128:
        raise ValueError(f"{where}: a k_grouped shape's k (the total tokens of its groups, each a "
                         f"multiple of 128) must be a multiple of 128, got {item}")
    if kind == "wgrad" and g != 1:
        raise ValueError(f"{where}: a wgrad shape has one group, got {item}")
    return Shape(kind, *vals)


def _parse_json(path: str, text: str) -> list[Shape]:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"cannot read shapes file {path}: {type(exc).__name__}: {str(exc)[:80]}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of shape objects, got {type(data).__name__}")
    shapes = []
    for i, item in enumerate(data):
        where = f"{path}[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected an object, got {item!r}")
        unknown = set(item) - {"kind", "m", "n", "k", "num_groups"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        try:
            vals = [item[key] for key in ("m", "n", "k")] + [item.get("num_groups", 1)]
        except KeyError as exc:
            raise ValueError(f"{where}: missing key {exc}") from None
        shapes.append(_validate(where, item.get("kind", "normal"), vals, item))
    return shapes


def _parse_text(path: str, text: str) -> list[Shape]:
    shapes = []
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{path}:{lineno}"
        if len(fields) not in (4, 5):
            raise ValueError(f"{where}: expected 'kind m n k [num_groups]', got {line.strip()!r}")
        try:
            vals = [int(f) for f in fields[1:]] + ([1] if len(fields) == 4 else [])
        except ValueError:
            raise ValueError(f"{where}: m, n, k, num_groups must be integers, got {line.strip()!r}") from None
        shapes.append(_validate(where, fields[0], vals, line.strip()))
    return shapes


def load_shapes(path: str) -> list[Shape]:
    """Parse a shapes file (JSON list or ``kind m n k [num_groups]`` lines,
    see the module docstring), or a preset name (:data:`PRESETS`).

    ``m`` is m_sum for ``contiguous`` and expected_m for ``masked`` (the
    values the configuration is chosen from).  Raises ValueError.
    """
    if str(path) in PRESETS:
        return preset_shapes(str(path))
    if str(path).startswith("@"):
        raise ValueError(f"unknown shapes preset {path}; the presets are {', '.join(sorted(PRESETS))}")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read shapes file {path}: {exc}") from None
    head = text.lstrip()[:1]
    if head == "{":
        raise ValueError(f"shapes file {path}: a JSON shapes file must be a list of objects, "
                         f"not an object")
    shapes = _parse_json(str(path), text) if head == "[" else _parse_text(str(path), text)
    if not shapes:
        raise ValueError(f"shapes file {path} lists no shapes")
    return shapes
