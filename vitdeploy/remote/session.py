"""One ``--on HOST`` run: check the device, copy what changed, run there, bring the results back.

Remote layout (``--remote-dir``, default ``~/.cache/vitdeploy/remote/<bundle>-<id>``)::

    ROOT/bundle/   a mirror of the local bundle (plus .vitdeploy-hashes.json, the hash manifest)
    ROOT/work/     input and output files named on the command line, at the paths they were given
                   (the command runs with ROOT/work as its current directory)

Copies go one way per step and are checked end to end (see :mod:`.agent`): files whose sha256
already matches the device's hash manifest are not sent again. What the command changed under
ROOT/bundle comes back into the local bundle only after the whole stream arrived intact:
``engines/<target>/`` is swapped in as one folder, other files (reports) are renamed into place,
and ``manifest.json`` last, merged with any local change made meanwhile. A lost connection at any
point leaves the local bundle as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import UserError
from ..fileio import atomic_path, atomic_write_json, sha256_file, swap_dir
from ..records import engines_of, set_engines
from . import agent
from .target import SSH_OPTIONS_ENV, Target, close_master, remote_shell, ssh_command

AGENT_COMMAND = "remote-agent"
MANIFEST = "manifest.json"


class RemoteError(UserError):
    """ssh, the device's vitdeploy, or a copy failed: one line saying which and what to do."""


@dataclass
class PathArg:
    """A file or folder named on the command line: copied to ROOT/work/<rel> and/or brought back."""

    local: Path
    rel: str
    upload: bool = True
    download: bool = False


@dataclass
class RemoteRequest:
    on: str
    command: str
    bundle: str
    options: List[str]  # argv before the positionals, paths already rewritten
    positionals: List[str]  # after the bundle, paths already rewritten
    paths: List[PathArg] = field(default_factory=list)
    remote_vitdeploy: str = "vitdeploy"
    remote_dir: Optional[str] = None


@dataclass
class RemoteOutcome:
    returncode: int
    uploaded: List[str]
    downloaded: List[str]
    device: Dict[str, Any]


def work_relpath(value: str) -> str:
    """Where a path given on the command line lives under ROOT/work (relative paths keep their shape)."""
    norm = os.path.normpath(value)
    if not os.path.isabs(norm) and norm != ".." and not norm.startswith(".." + os.sep):
        return Path(norm).as_posix()
    return "_abs" + Path(os.path.abspath(value)).as_posix()


def default_remote_dir(bundle: Path) -> str:
    """Stable per (this machine, this bundle path): a second run finds its earlier copy."""
    key = hashlib.sha256(f"{socket.gethostname()}:{bundle.resolve()}".encode()).hexdigest()[:10]
    return f"~/.cache/vitdeploy/remote/{bundle.resolve().name}-{key}"


def _quote_path(path: str) -> str:
    """Shell-quote a remote path, keeping a leading ``~/`` expandable."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + remote_shell(path[2:])
    return remote_shell(path)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0  # type: ignore[assignment]
    return f"{n} B"


class Session:
    def __init__(self, request: RemoteRequest, log: Callable[[str], None], out: Callable[[str], None],
                 err: Callable[[str], None]):
        self.req = request
        self.target = Target.parse(request.on)
        self.log, self.out, self.err = log, out, err
        self.vitdeploy = request.remote_vitdeploy or "vitdeploy"
        # One ssh connection for all steps (a socket path must stay short: /tmp, not the bundle's dir).
        self._control_dir = tempfile.mkdtemp(prefix="vd-ssh-", dir="/tmp" if os.path.isdir("/tmp") else None)
        self._control_path = os.path.join(self._control_dir, "c")

    def close(self) -> None:
        if os.path.exists(self._control_path):
            try:
                close_master(self.target, self._control_path)
            except (OSError, subprocess.SubprocessError):
                pass
        shutil.rmtree(self._control_dir, ignore_errors=True)

    # -- ssh -------------------------------------------------------------------------------------
    def _argv(self, remote_command: str) -> List[str]:
        return ssh_command(self.target, remote_command, self._control_path)

    def _agent_words(self, *args: str) -> str:
        return _quote_path(self.vitdeploy) + " " + remote_shell(AGENT_COMMAND, *args)

    def _fail(self, returncode: int, stderr: str, doing: str) -> RemoteError:
        """Turn an ssh/remote failure into one line: unreachable, auth, no vitdeploy, old vitdeploy, other."""
        text = " ".join(stderr.split())
        last = next((line.strip() for line in reversed(stderr.strip().splitlines()) if line.strip()), "no message")
        where = str(self.target)
        if returncode == 255:
            if "Permission denied" in text or "Too many authentication failures" in text:
                return RemoteError(f"ssh to {where} refused the login ({last}); vitdeploy uses your own ssh keys, agent and "
                                   f"~/.ssh/config without prompting (BatchMode): install your key on the device "
                                   f"(ssh-copy-id {self.target.destination}) or name it in ~/.ssh/config")
            if "Host key verification failed" in text or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
                return RemoteError(f"the host key of {where} is not known or has changed; connect once with "
                                   f"`ssh {self.target.destination}` to check and accept it")
            for marker in ("Could not resolve hostname", "Connection refused", "Connection timed out", "No route to host",
                           "Network is unreachable", "Operation timed out", "Connection closed", "Connection reset",
                           "port 65535", "Name or service not known"):
                if marker in text:
                    return RemoteError(f"cannot reach {where} over ssh ({last}); check the address and port, and that sshd runs there")
            return RemoteError(f"ssh to {where} failed while {doing} ({last})")
        if returncode in (126, 127):
            return RemoteError(f"no runnable vitdeploy at {self.vitdeploy!r} on {where} ({last}); install it there "
                               f"(pip install vitdeploy in a venv made with --system-site-packages, to see JetPack's "
                               f"TensorRT) and name it with --remote-vitdeploy PATH")
        if ("No such command" in text and AGENT_COMMAND in text) or ("No such option" in text and returncode == 2):
            return RemoteError(f"the vitdeploy at {self.vitdeploy!r} on {where} is too old for --on (it has no "
                               f"`{AGENT_COMMAND}`); install the same vitdeploy version there as here")
        return RemoteError(f"{doing} on {where} failed (exit {returncode}): {last}")

    def _agent_json(self, *args: str, doing: str) -> Dict[str, Any]:
        proc = subprocess.run(self._argv(self._agent_words(*args)), stdin=subprocess.DEVNULL, capture_output=True)
        stderr = proc.stderr.decode("utf-8", "replace")
        if proc.returncode != 0:
            raise self._fail(proc.returncode, stderr, doing)
        try:
            return json.loads(proc.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteError(f"{doing} on {self.target}: the device's vitdeploy answered something that is not JSON "
                              f"({proc.stdout[:120]!r}); is {self.vitdeploy!r} vitdeploy?") from None

    # -- steps -----------------------------------------------------------------------------------
    def hello(self, index_roots: Sequence[str] = ()) -> Dict[str, Any]:
        """Check the device's vitdeploy (formats, version) and list ``index_roots`` in the same call."""
        from .. import __version__
        from ..bundle import FORMAT as BUNDLE_FORMAT
        from ..engine.fingerprint import FORMAT as ENGINE_FORMAT

        args = ["hello"]
        for root in index_roots:
            args += ["--index", root]
        info = self._agent_json(*args, doing="asking the device's vitdeploy for its version")
        there = info.get("vitdeploy_version")
        if info.get("bundle_format") != BUNDLE_FORMAT or info.get("engine_format") != ENGINE_FORMAT:
            raise RemoteError(f"version skew: vitdeploy {there} on {self.target} reads {info.get('bundle_format')} / "
                              f"{info.get('engine_format')}, this vitdeploy {__version__} writes {BUNDLE_FORMAT} / {ENGINE_FORMAT}; "
                              f"install vitdeploy {__version__} on the device (pip install 'vitdeploy=={__version__}')")
        model = f", {info['device_model']}" if info.get("device_model") else ""
        self.log(f"on {self.target}: vitdeploy {there}, Python {info.get('python')} on {info.get('machine')}{model} ({info.get('hostname')})")
        if there != __version__:
            self.log(f"note: vitdeploy {__version__} here, {there} on {self.target} (same bundle and engine formats)")
        return info

    def upload(self, listing: Dict[str, Any], local_files: Dict[str, Path], delete_missing: bool, what: str,
               local_hashes: Optional[Dict[str, str]] = None) -> Tuple[str, Dict[str, str], List[str]]:
        """Make the device's folder (``listing``: its root and hashes) hold ``local_files``.

        Returns (absolute remote root, its hashes after, the paths sent)."""
        root, remote = listing["root"], listing["files"]
        local = {rel: (local_hashes or {}).get(rel) or sha256_file(path) for rel, path in local_files.items()}
        send = sorted(rel for rel, digest in local.items() if remote.get(rel) != digest)
        delete = sorted(set(remote) - set(local)) if delete_missing else []
        if not send and not delete:
            self.log(f"on {self.target}: {what} up to date ({len(local)} files unchanged)")
            return root, remote, []
        size = sum(local_files[rel].stat().st_size for rel in send)
        self.log(f"on {self.target}: copying {len(send)} of {len(local)} files of the {what} ({_fmt_bytes(size)})"
                 + (f", removing {len(delete)}" if delete else ""))
        proc = subprocess.Popen(self._argv(self._agent_words("receive", root)), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stderr_chunks: List[bytes] = []
        reader = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        broken = False
        try:
            agent.write_stream(proc.stdin, {rel: local_files[rel] for rel in send}, delete)  # type: ignore[arg-type]
            proc.stdin.close()  # type: ignore[union-attr]
        except OSError:  # BrokenPipeError, ConnectionResetError: the other side went away
            broken = True
        stdout = proc.stdout.read()  # type: ignore[union-attr]
        proc.wait()
        reader.join()
        stderr = b"".join(stderr_chunks).decode("utf-8", "replace")
        if proc.returncode != 0 or broken:
            if proc.returncode in (126, 127):
                raise self._fail(proc.returncode, stderr, f"copying the {what}")
            last = (stderr.strip().splitlines() or ["connection closed"])[-1]
            if proc.returncode == 255:  # the device answered a moment ago: the link broke
                last = f"connection lost: {last}"
            last = last[len("error: "):] if last.startswith("error: ") else last
            raise RemoteError(f"copying the {what} to {self.target} stopped part-way (device: {last}); the device kept its previous "
                              f"copy and nothing changed here; run the command again")
        try:
            after = json.loads(stdout.decode("utf-8", "replace").strip().splitlines()[-1])["files"]
        except (ValueError, IndexError, KeyError):
            raise RemoteError(f"copying the {what} to {self.target}: the device's vitdeploy gave no file list back "
                              f"({stdout[-120:]!r}); run the command again") from None
        return root, after, send

    def run_remote(self, bundle_root: str, work_root: str) -> int:
        words = [self.req.command, *self.req.options, "--", bundle_root, *self.req.positionals]
        self.log(f"on {self.target}: vitdeploy {remote_shell(*words)}")
        # stdin stays open and unused: when this process ends (Ctrl-C, a crash) it closes, and the agent
        # stops the command on the device (ssh without a terminal passes no signal on). ssh runs in its
        # own session (BatchMode: it never prompts), so a Ctrl-C reaches this process only: ssh dying of
        # the same SIGINT first would read as a broken link (exit 255) instead of an interruption.
        proc = subprocess.Popen(self._argv(self._agent_words("run", work_root, "--", *words)), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        tail: List[str] = []

        def pump(stream: IO[bytes], emit: Callable[[str], None], keep: bool) -> None:
            for raw in iter(stream.readline, b""):
                text = raw.decode("utf-8", "replace")
                emit(text)
                if keep:
                    tail.append(text)
                    del tail[:-20]

        threads = [threading.Thread(target=pump, args=(proc.stdout, self.out, False), daemon=True),
                   threading.Thread(target=pump, args=(proc.stderr, self.err, True), daemon=True)]
        for t in threads:
            t.start()
        try:
            # wait in short steps: the kernel may hand SIGINT to a pump thread, and only the main thread's
            # bytecode raises KeyboardInterrupt; a blocking wait would not wake until ssh ended
            while True:
                try:
                    proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    continue
        except BaseException:  # Ctrl-C: close the connection's stdin; the agent stops the command on the device
            _close_quietly(proc.stdin)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        for t in threads:
            t.join()
        proc.stdin.close()  # type: ignore[union-attr]
        if proc.returncode == 255:
            raise RemoteError(f"the connection to {self.target} broke while `vitdeploy {self.req.command}` ran "
                              f"({(tail or ['no message'])[-1].strip()}); nothing was brought back and the local bundle is unchanged; "
                              f"run the command again")
        if proc.returncode in (126, 127):
            raise self._fail(proc.returncode, "".join(tail), f"running `vitdeploy {self.req.command}`")
        return proc.returncode

    def download(self, remote_root: str, send_args: List[str], staging_parent: Path, what: str) -> Tuple[Path, Dict[str, str]]:
        """Fetch what ``remote-agent send REMOTE_ROOT SEND_ARGS`` streams into a verified staging folder under
        ``staging_parent`` (same file system as the destination, so moving into place is a rename)."""
        staging = Path(tempfile.mkdtemp(prefix=".vitdeploy-pull.", dir=staging_parent))
        proc = subprocess.Popen(self._argv(self._agent_words("send", remote_root, *send_args)), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stderr_chunks: List[bytes] = []
        reader = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        try:
            try:
                received, _ = agent.read_stream(proc.stdout, staging)  # type: ignore[arg-type]
                problem = None
            except agent.TransferError as exc:
                received, problem = {}, str(exc)
            proc.stdout.read()  # type: ignore[union-attr]
            proc.wait()
            reader.join()
            stderr = b"".join(stderr_chunks).decode("utf-8", "replace")
            if proc.returncode in (126, 127) and problem is None:
                raise self._fail(proc.returncode, stderr, f"bringing back the {what}")
            if problem is not None or proc.returncode != 0:
                last = (stderr.strip().splitlines() or [problem or "connection closed"])[-1]
                raise RemoteError(f"bringing back the {what} from {self.target} stopped part-way ({problem or last}); "
                                  f"nothing changed here (the results stay on the device under {remote_root}); run again")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return staging, received


def _merge_manifest(base: Dict[str, Any], theirs: Dict[str, Any], ours: Dict[str, Any]) -> Dict[str, Any]:
    """Three-way merge, two levels deep: keys the device changed take its value; local changes made
    meanwhile to other keys (or other engine targets, other records) are kept."""
    merged = json.loads(json.dumps(ours))
    for key in set(base) | set(theirs):
        if theirs.get(key) == base.get(key):
            continue
        if key not in theirs:
            merged.pop(key, None)
        elif isinstance(theirs[key], dict) and isinstance(base.get(key), dict) and isinstance(merged.get(key), dict):
            for sub in set(base[key]) | set(theirs[key]):
                if theirs[key].get(sub) == base[key].get(sub):
                    continue
                if sub in theirs[key]:
                    merged[key][sub] = theirs[key][sub]
                else:
                    merged[key].pop(sub, None)
        else:
            merged[key] = theirs[key]
    return merged


def run(request: RemoteRequest, log: Callable[[str], None], out: Callable[[str], None], err: Callable[[str], None]) -> RemoteOutcome:
    from ..bundle import Bundle

    bundle_dir = Path(request.bundle)
    if not bundle_dir.is_dir():
        raise UserError(f"--on needs a bundle folder ({request.bundle} is not one; a bare .onnx has no engines/ or "
                        f"reports/ to bring back): export with -o DIR")
    Bundle.open(bundle_dir)  # a readable bundle of this format, before anything is copied
    session = Session(request, log, out, err)
    try:
        return _run(session, request, bundle_dir, log)
    finally:
        session.close()


def _run(session: Session, request: RemoteRequest, bundle_dir: Path, log: Callable[[str], None]) -> RemoteOutcome:
    root = (request.remote_dir or default_remote_dir(bundle_dir)).rstrip("/") or "/"
    bundle_key, work_key = f"{root}/bundle", f"{root}/work"
    device = session.hello([bundle_key, work_key] if request.paths else [bundle_key])
    base_manifest = json.loads((bundle_dir / MANIFEST).read_text())

    # The local bundle keeps the same hash manifest as the device (by size and mtime): a multi-GB
    # bundle is hashed once, not on every run.
    bundle_root, remote_bundle, sent = session.upload(device["index"][bundle_key], agent.walk_files(bundle_dir),
                                                      delete_missing=True, what="bundle", local_hashes=agent.index(bundle_dir))
    work_root, sent_work = bundle_root, []  # with no paths on the command line, any current directory does
    if request.paths:
        work_files: Dict[str, Path] = {}
        for arg in request.paths:
            if arg.upload and arg.local.is_dir():
                for rel, path in agent.walk_files(arg.local).items():
                    work_files[f"{arg.rel}/{rel}"] = path
            elif arg.upload and arg.local.is_file():
                work_files[arg.rel] = arg.local
        work_root, _, sent_work = session.upload(device["index"][work_key], work_files, delete_missing=False, what="input files")

    returncode = session.run_remote(bundle_root, work_root)

    # What the command changed on the device (by hash, against the manifest written before it ran) comes
    # back in one stream; engines/<target>/ travels whole (plan and engine.json belong together).
    staging, received = session.download(bundle_root, ["--changed", "--whole", "engines"], bundle_dir, "results")
    pulled: List[str] = sorted(received)
    try:
        engine_dirs = sorted({"/".join(rel.split("/")[:2]) for rel in received if rel.startswith("engines/") and rel.count("/") >= 2})
        for unit in engine_dirs:
            swap_dir(staging / unit, bundle_dir / unit)
        # a graph after its external data file (vitdeploy.onnx_io): the new graph never names old data
        for rel in sorted(received, key=lambda r: (r.endswith(".onnx"), r)):
            if rel == MANIFEST or any(rel.startswith(u + "/") for u in engine_dirs):
                continue
            dest = bundle_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / rel, dest)
        if MANIFEST in received:
            theirs = json.loads((staging / MANIFEST).read_text())
            ours = json.loads((bundle_dir / MANIFEST).read_text())
            merged = _merge_manifest(base_manifest, theirs, ours)
            engines = engines_of(merged)
            built_on = {"on": str(session.target), "hostname": device.get("hostname"),
                        "device_model": device.get("device_model"), "machine": device.get("machine")}
            stamped = {target: engines[target].with_extras(built_on=built_on)  # which device built it, as the workstation reached it
                       for target in (unit.split("/", 1)[1] for unit in engine_dirs) if target in engines}
            if stamped:
                set_engines(merged, {**engines, **stamped})
            atomic_write_json(bundle_dir / MANIFEST, merged)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if pulled:
        log(f"on {session.target}: brought back {len(pulled)} files into {bundle_dir} ({', '.join(pulled[:4])}{', ...' if len(pulled) > 4 else ''})")

    # Output paths named on the command line (profile -o, timing caches) go back where they were named.
    outputs = [a for a in request.paths if a.download]
    if outputs:
        staging, received = session.download(work_root, ["--changed", *[a.rel for a in outputs]], Path(tempfile.gettempdir()), "output files")
        try:
            for rel in sorted(received):
                arg = next(a for a in outputs if rel == a.rel or rel.startswith(a.rel + "/"))
                dest = arg.local if rel == arg.rel else arg.local / rel[len(arg.rel) + 1:]
                with atomic_path(dest) as tmp:  # may be another file system than the staging folder
                    shutil.copyfile(staging / rel, tmp)
                pulled.append(str(dest))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return RemoteOutcome(returncode=returncode, uploaded=sent + sent_work, downloaded=pulled, device=device)


__all__ = ["RemoteRequest", "RemoteOutcome", "PathArg", "RemoteError", "run", "work_relpath", "SSH_OPTIONS_ENV"]


def _close_quietly(stream: Any) -> None:
    try:
        stream.close()
    except OSError:  # the other side already went away
        pass
