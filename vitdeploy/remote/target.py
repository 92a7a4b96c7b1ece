"""``[USER@]HOST[:PORT]`` and the OpenSSH command lines that reach it.

vitdeploy never holds credentials: it runs the user's own ``ssh`` with their keys, agent and
``~/.ssh/config``, non-interactively (``BatchMode=yes``: a missing key is an error, not a password
prompt that would hang). ``VITDEPLOY_SSH_OPTIONS`` adds options to every ssh call (``-F config``,
``-i key``, ``-o Name=value``), which is how the tests point ssh at a throwaway sshd.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from dataclasses import dataclass
from typing import List, Optional

from ..errors import UserError

SSH_OPTIONS_ENV = "VITDEPLOY_SSH_OPTIONS"
_HOST = re.compile(r"^[A-Za-z0-9_.%-]+$")


@dataclass(frozen=True)
class Target:
    host: str
    user: Optional[str] = None
    port: Optional[int] = None

    @classmethod
    def parse(cls, text: str) -> "Target":
        """``jetson``, ``nvidia@orin.local``, ``nvidia@10.0.0.7:2222``, ``[fe80::1]:22``."""
        raw = (text or "").strip()
        user = None
        rest = raw
        if "@" in rest:
            user, _, rest = rest.rpartition("@")
            if not user or any(c in user for c in " /:"):
                raise UserError(f"--on {text!r}: the user name before '@' is empty or odd; write [USER@]HOST[:PORT]")
        port_text = None
        if rest.startswith("["):  # [IPv6]:port
            host, sep, tail = rest[1:].partition("]")
            if not sep or (tail and not tail.startswith(":")):
                raise UserError(f"--on {text!r}: write an IPv6 address as [ADDR] or [ADDR]:PORT")
            port_text = tail[1:] if tail else None
        elif rest.count(":") == 1:
            host, _, port_text = rest.partition(":")
        else:
            host = rest
        if not host or host.startswith("-") or not (_HOST.match(host) or ":" in host):
            raise UserError(f"--on {text!r}: no host name; write [USER@]HOST[:PORT], e.g. nvidia@orin.local:22")
        port = None
        if port_text is not None:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise UserError(f"--on {text!r}: port {port_text!r} is not a number in 1..65535")
            port = int(port_text)
        return cls(host=host, user=user, port=port)

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = f"{self.user}@{host}" if self.user else host
        return f"{text}:{self.port}" if self.port else text


def user_ssh_options() -> List[str]:
    """Extra ssh options from ``VITDEPLOY_SSH_OPTIONS`` (shell-quoted), e.g. ``-F ~/.ssh/jetson.conf``."""
    text = os.environ.get(SSH_OPTIONS_ENV, "")
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise UserError(f"{SSH_OPTIONS_ENV}={text!r} does not parse as shell words ({exc})") from None


def ssh_command(target: Target, remote_command: str, control_path: Optional[str] = None) -> List[str]:
    """The ssh argv that runs ``remote_command`` (already shell-quoted) on ``target``.

    ``control_path``: share one authenticated connection between the calls of a session (OpenSSH
    multiplexing): one handshake per ``--on`` run instead of one per step.
    """
    ssh = shutil.which("ssh")
    if ssh is None:
        raise UserError("`--on` needs the OpenSSH client (ssh) on this machine; install it (apt-get install openssh-client)")
    argv = [
        ssh,
        "-o", "BatchMode=yes",  # never prompt: a missing key fails at once with "Permission denied"
        "-o", "ConnectTimeout=15",
        "-o", "ServerAliveInterval=15",  # a dead link is noticed within a minute, not hours
        "-o", "ServerAliveCountMax=4",
    ]
    if control_path:
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control_path}", "-o", "ControlPersist=120"]
    argv += user_ssh_options()
    if target.port:
        argv += ["-p", str(target.port)]
    argv += ["--", target.destination, remote_command]
    return argv


def close_master(target: Target, control_path: str) -> None:
    """Stop the shared connection of a session (it would otherwise linger for ControlPersist)."""
    import subprocess

    ssh = shutil.which("ssh") or "ssh"
    argv = [ssh, "-o", f"ControlPath={control_path}", "-O", "exit"] + (["-p", str(target.port)] if target.port else [])
    subprocess.run(argv + user_ssh_options() + ["--", target.destination], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)


def remote_shell(*words: str) -> str:
    """Quote ``words`` for the remote login shell (ssh joins its arguments with spaces)."""
    return " ".join(shlex.quote(w) for w in words)
