"""`vitdeploy remote-agent` (hidden): the device side of `--on HOST`, see vitdeploy/remote/."""

from __future__ import annotations

from ..remote.cli import agent_command as command

__all__ = ["command"]
