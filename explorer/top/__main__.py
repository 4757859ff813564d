"""``python -m explorer.top``: the same as ``neuron-top``."""

import sys

from explorer.top import main

sys.exit(main())
