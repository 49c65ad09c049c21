"""``python -m cugemm8.cli``: the same as ``python -m cugemm8``."""
from ._main import main

raise SystemExit(main())
