"""On-disk and wire formats: the Neuron Explorer Parquet profile, neuron-monitor JSON, exports.

Formats never import the explorer. Filled in by the profile-format issue.
"""
