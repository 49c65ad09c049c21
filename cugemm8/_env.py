"""Every ``CUGEMM8_*`` environment variable, read in this one place.

Other modules import this module (not its values) so tests and tools can
override a setting by assigning to the attribute at run time.

| variable | meaning |
|---|---|
| ``CUGEMM8_JIT_DEBUG`` | print each compile / cache load with its time |
| ``CUGEMM8_PRINT_CONFIGS`` | print the kernel configuration chosen for each new shape |
| ``CUGEMM8_DISABLE_CACHE`` | never load or write compiled kernels on disk (always compile) |
| ``CUPY_CACHE_DIR`` | its ``cugemm8/`` folder holds cugemm8's kernel cache (read at each build; CuPy reads it when imported) |
| ``CUGEMM8_PTXAS_VERBOSE`` | print ptxas's resource report for each compiled kernel |
| ``CUGEMM8_DUMP_DIR`` | write the generated source, PTX and ptxas report of each compile here |
| ``CUGEMM8_TUNED_FILE`` | the tuned-configurations file (``cugemm8 tune``); ``off`` turns them off; read by :mod:`cugemm8._tuned` at first use, not here |
| ``CUGEMM8_RANK`` and three more | one rank of ``python -m cugemm8.launch``: see and read in :mod:`cugemm8.launch` |
"""
from __future__ import annotations

import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() not in ("", "0", "false", "no", "off")


JIT_DEBUG: bool = _flag("CUGEMM8_JIT_DEBUG")
PRINT_CONFIGS: bool = _flag("CUGEMM8_PRINT_CONFIGS")
DISABLE_CACHE: bool = _flag("CUGEMM8_DISABLE_CACHE")
PTXAS_VERBOSE: bool = _flag("CUGEMM8_PTXAS_VERBOSE")
DUMP_DIR: str | None = os.environ.get("CUGEMM8_DUMP_DIR") or None
