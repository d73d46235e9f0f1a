"""`python -m xattn ...` (and `torchrun -m xattn train ...` for multi-process training)."""
import sys

from xattn.cli.main import main

sys.exit(main())
