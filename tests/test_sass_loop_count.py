"""CPU tests of tools/perf/sass_loop_count.py's loop finder on a synthetic disassembly."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "perf"))
import sass_loop_count as slc  # noqa: E402

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a0000017a02 */
        /*0010*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT ;   /* 0x0 */
        /*0020*/               @P0 BRA 0x0 ;                               /* 0x0 */
        /*0030*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR12], R24 ;   /* 0x0 */
        /*0040*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR28], RZ, !UPT ;   /* 0x0 */
        /*0050*/                   FFMA R2, R3, R4, R2 ;                  /* 0x0 */
        /*0060*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR24], R24 ;   /* 0x0 */
        /*0070*/                   FFMA R5, R3, R6, R5 ;                  /* 0x0 */
        /*0080*/              @!P1 BRA 0x30 ;                              /* 0x0 */
        /*0090*/                   EXIT ;                                 /* 0x0 */
"""


def test_the_loop_with_the_most_qgmmas_is_the_main_loop():
    body, q, rng = slc.main_loop(SASS)
    assert q == 2 and len(body) == 6 and rng == (0x30, 0x80)   # not the one-QGMMA loop at 0x0
    assert slc.opcode(body[-1]) == "BRA" and slc.opcode(body[0]) == "SYNCS"


def test_report_counts_per_k_block():
    text = slc.report(SASS, "x", qgmma_per_block=2)
    assert "1 K blocks" in text and "6.0 per K block" in text and "FFMA 2.00" in text
    assert "no loop" in slc.report("", "y", 8)


def test_functions_are_searched_apart():
    """cuobjdump restarts addresses in each function: the loops must not mix."""
    other = SASS.replace("FFMA R2", "FADD R2").replace("@!P1 BRA 0x30", "@!P1 BRA.U 0x30")
    listing = "\n\tFunction : kernel_a\n" + SASS + "\n\tFunction : kernel_b\n" + other
    assert [n for n, _ in slc.functions(listing)] == ["kernel_a", "kernel_b"]
    body, q, rng = slc.main_loop(listing)
    assert q == 2 and len(body) == 6 and rng == (0x30, 0x80)
    body, q, _ = slc.main_loop("\n\tFunction : kernel_b\n" + other)
    assert q == 2 and slc.opcode(body[-1]) == "BRA"          # BRA.U is a back edge too


def test_the_k_loop_is_chosen_over_the_tile_loop_around_it():
    """A tile loop holding two K loops has more QGMMAs than either; the innermost loop is the K loop."""
    nested = SASS.replace("        /*0090*/                   EXIT ;", """        /*0090*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT ;   /* 0x0 */
        /*00a0*/                   FFMA R7, R3, R6, R5 ;                  /* 0x0 */
        /*00b0*/              @!P1 BRA 0x90 ;                              /* 0x0 */
        /*00c0*/               @P2 BRA 0x30 ;                              /* 0x0 */
        /*00d0*/                   EXIT ;""")
    body, q, rng = slc.main_loop(nested)
    assert q == 2 and rng == (0x30, 0x80)
