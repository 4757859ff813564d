"""User settings shared by every tool: today, the default instance type.

Resolution order: ``NEURONSCOPE_INSTANCE``, then ``instance = "..."`` in
``$NEURONSCOPE_CONFIG`` or ``~/.config/neuronscope/config.toml``, then ``trn1.2xlarge``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from neuroncore.hardware import DEFAULT_INSTANCE, INSTANCE_TYPES
from neuronscope import settings


def config_path() -> Path:
    explicit = settings.CONFIG.get()
    if explicit is not None:
        return explicit
    base = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    return base / "neuronscope" / "config.toml"


def load_config() -> dict:
    path = config_path()
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read config {path}: {exc}") from exc


def default_instance() -> str:
    name = settings.INSTANCE.get() or load_config().get("instance") or DEFAULT_INSTANCE
    if name not in INSTANCE_TYPES:
        known = ", ".join(sorted(INSTANCE_TYPES))
        raise ValueError(f"default instance {name!r} is not a known type; known: {known}")
    return name
