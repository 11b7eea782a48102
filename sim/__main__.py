"""``python -m sim``: the ``kvsim`` command line (:mod:`sim.app.cli.main`)."""

import sys

from sim.app.cli.main import main

sys.exit(main())
