"""What to call a process: its script or model, not its interpreter's path or a bare pid.

A publisher's command line is ``/work/main/.venv/bin/python my_script.py --steps 3``: cut to a
table cell that is a truncated interpreter path, and a process without ``NEURON_PROCESS_TAG`` is
tagged with its pid. People know their jobs by the script they ran and the model it runs, so the
process table shows ``my_script.py --steps 3`` and a tab ``my_script.py (mlp)``; an explicit tag
still wins (the user chose it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from explorer.top.snapshots import LoadedModel, ProcessSnapshot

_INTERPRETER = re.compile(r"(python|pypy)[\d.]*[a-z]?(\.exe)?")
_OPTION_WITH_VALUE = {"-W", "-X", "-Q"}
# "0.1.0+13fdce652-bert_layer": our compiler's version and hash in front of the model's own name
_VERSION_PREFIX = re.compile(r"^\d+\.\d+[\w.]*\+[0-9a-f]+-")
TAB_LABEL_MAX = 32


@dataclass(frozen=True)
class Program:
    """A command line split into what the user ran (``name``) and its arguments."""

    name: str
    args: str = ""

    def __str__(self) -> str:
        return f"{self.name} {self.args}" if self.args else self.name


def program(command: str | None) -> Program | None:
    """The script (or module, or executable) of a command line, None if there is none.

    ``python my_script.py a`` -> ``my_script.py`` + ``a``; ``python -u -m pkg.mod a`` ->
    ``pkg.mod`` + ``a``; ``python -c ...`` -> ``python -c``; ``/x/bin/neuron-profile run -w m`` (a
    console script) -> ``neuron-profile run`` + ``-w m`` (its subcommand is part of what it is)."""
    tokens = (command or "").split()
    if not tokens:
        return None
    exe = os.path.basename(tokens[0])
    i = 0
    if _INTERPRETER.fullmatch(exe):
        i = 1
        while i < len(tokens) and tokens[i].startswith("-") and tokens[i] != "-":
            option = tokens[i]
            if option == "-m" and i + 1 < len(tokens):
                return Program(tokens[i + 1], " ".join(tokens[i + 2:]))
            if option.startswith("-m") and len(option) > 2:
                return Program(option[2:], " ".join(tokens[i + 1:]))
            if option.startswith("-c"):
                return Program(f"{exe} -c", " ".join(tokens[i + 1:]))
            i += 2 if option in _OPTION_WITH_VALUE else 1
            if option == "--":
                break
        if i >= len(tokens):
            return Program(exe)
    name = os.path.basename(tokens[i].rstrip("/")) or tokens[i]
    rest = tokens[i + 1:]
    script = name.endswith((".py", ".pyz", ".sh"))
    if not script and rest and re.fullmatch(r"[a-z][\w-]*", rest[0]):
        name, rest = f"{name} {rest[0]}", rest[1:]  # a console script's subcommand: "neuron-profile run"
    return Program(name, " ".join(rest))


def model_name(name: str) -> str:
    """A loaded model's name as people call it: no directories, no ``.neff``, no version prefix."""
    base = os.path.basename(name.rstrip("/")) or name
    base = base.removesuffix(".neff")
    return _VERSION_PREFIX.sub("", base) or base


def model_names(models: tuple[LoadedModel, ...]) -> tuple[str, ...]:
    """The distinct model names of a process, in load order."""
    return tuple(dict.fromkeys(model_name(m.name) for m in models if m.name))


def has_own_tag(p: ProcessSnapshot) -> bool:
    """The process was tagged on purpose (``NEURON_PROCESS_TAG``), not with its pid by default."""
    return bool(p.tag) and p.tag != str(p.pid)


def command_text(p: ProcessSnapshot) -> str:
    """The process table's COMMAND: ``[tag] my_script.py args``; the tag, models or pid when the
    source has no command line (a neuron-monitor stream)."""
    prog = program(p.command)
    tag = f"[{p.tag}] " if has_own_tag(p) else ""
    if prog is not None:
        return tag + str(prog)
    models = model_names(p.models)
    if has_own_tag(p):
        return p.tag + (f" ({', '.join(models)})" if models else "")
    return ", ".join(models) or p.tag or str(p.pid)


def label(p: ProcessSnapshot) -> str:
    """A tab's label: the tag if the user set one, else ``my_script.py (model)``, else the models,
    else the pid; at most ``TAB_LABEL_MAX`` characters."""
    if has_own_tag(p):
        text = p.tag
    else:
        prog = program(p.command)
        models = ", ".join(model_names(p.models))
        if prog is not None:
            text = f"{prog.name} ({models})" if models and models not in prog.name else prog.name
        else:
            text = models or str(p.pid)
    return text if len(text) <= TAB_LABEL_MAX else text[:TAB_LABEL_MAX - 1] + "…"


def describe(p: ProcessSnapshot) -> str:
    """One line for dialogs and the status line: ``pid 4100 my_script.py (mlp)``."""
    models = model_names(p.models)
    prog = program(p.command)
    what = prog.name if prog is not None else (p.tag if has_own_tag(p) else "")
    if models:
        what = f"{what} ({', '.join(models)})" if what else ", ".join(models)
    return f"pid {p.pid} {what}".rstrip()


__all__ = ["Program", "command_text", "describe", "has_own_tag", "label", "model_name", "model_names",
           "program"]
