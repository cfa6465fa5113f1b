"""`python -m nvdp.cli`: the `nvdp` command."""

import sys

from nvdp.cli import main

sys.exit(main())
