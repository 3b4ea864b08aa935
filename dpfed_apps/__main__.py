"""``python -m dpfed_apps ...``: the ``dpfed`` command line without the console script."""

import sys

from dpfed_apps.cli import main

sys.exit(main())
