"""``python -m cugemm8``: the ``cugemm8`` command line (see :mod:`cugemm8.cli`)."""
from .cli import main

raise SystemExit(main())
