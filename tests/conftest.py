"""Suite-wide settings.

Live-state publishing (``collectors.live``) attaches to every process that creates an ``Instance``.
The test process and the programs it starts must not publish unless a test asks for it: a listener
on the process-wide sink changes what the core builds (tests assert nothing is built unobserved),
and stray state files would appear in the user's runtime directory. Live-state tests set
``NEURONSCOPE_LIVE=1`` and their own ``NEURONSCOPE_LIVE_DIR`` for the processes they start.
"""

import os

os.environ["NEURONSCOPE_LIVE"] = "0"

# neuron-explorer's GUI tests use pytest-qt (qtbot), which needs a Qt binding; it is disabled in
# pyproject's addopts and loaded here only when the gui extra is installed, so a dev install without
# PySide6 still runs every other test (the GUI tests then skip: tests/explorer/gui/conftest.py).
try:
    import PySide6.QtCore  # noqa: F401
except ImportError:
    pytest_plugins: list[str] = []
else:
    pytest_plugins = ["pytestqt.plugin"]

# Every batch any test makes the execution core emit is checked against its declaration
# (neuroncore.record_kinds): a column or metadata field that drifts fails the test that emitted it.
from neuroncore.events import EventSink

EventSink.check_all = True

# Property tests judge their inputs, not the machine's speed: on a loaded 2-core CI machine
# Hypothesis's generation-time health check and per-example deadline failed tests whose logic was
# fine (test_blocks_round_trip). Settings given on a test still override this profile.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")
