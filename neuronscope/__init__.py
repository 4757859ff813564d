"""Plumbing shared by every neuronscope package: command-line kit and the settings registry.

This package imports nothing of ours, so the core (``neuroncore``), the recorders (``collectors``,
``formats``) and the viewers (``explorer``) can all depend on it without breaking the layering rule
that the core never imports the packages above it.

    neuronscope.cli_kit     argument parsing, the one CLI error type, output renderers
    neuronscope.settings    every environment variable we read (docs/settings.md)
"""
