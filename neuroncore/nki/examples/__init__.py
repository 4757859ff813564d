"""Kernels written for this project in the style of AWS's NKI tutorials (nki-samples).

They restate the algorithms of the published tutorial stages (the same loop nests, tile sizes and
blocking, so the same instructions and DMA access patterns) in our own code: ``bench/nki.py`` falls
back to them when the tutorial files themselves are not given, and the tests run them at small
shapes. Each file imports ``neuronxcc.nki`` as the tutorials do; run them through
``python -m neuroncore.nki`` or import them after :func:`neuroncore.nki.shim.install`.
"""
