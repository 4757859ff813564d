"""Everything that records: device profiles, system profiles, live state, sysfs, monitor streams.

Collectors subscribe to ``neuroncore.events.sink`` (or read real hardware sources); the core never
imports them. Filled in by the capture issues.
"""
