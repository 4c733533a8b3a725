"""``python -m trainopt`` runs the command-line interface."""

import sys

from trainopt.cli import main

sys.exit(main())
