"""Suite-wide settings.

Live-state publishing (``collectors.live``) attaches to every process that creates an ``Instance``.
The test process and the programs it starts must not publish unless a test asks for it: a listener
on the process-wide sink changes what the core builds (tests assert nothing is built unobserved),
and stray state files would appear in the user's runtime directory. Live-state tests set
``NEURONSCOPE_LIVE=1`` and their own ``NEURONSCOPE_LIVE_DIR`` for the processes they start.
"""

import os

os.environ["NEURONSCOPE_LIVE"] = "0"
