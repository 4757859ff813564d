"""``python -m neuroncore.nki``: see :mod:`neuroncore.nki.cli`."""

import sys

from neuroncore.nki.cli import main

sys.exit(main())
