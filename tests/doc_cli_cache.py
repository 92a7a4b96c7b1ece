"""`vitdeploy` as the documentation's shell blocks meet it in tests/test_docs.py: the real CLI, except that an
export of a built-in model already run with the same command line is copied from the run's export cache.

Several blocks export the digits model with the same flags (README's quick start and the input-contract page,
the two feature-export pages); each export costs 15-25 s of CPU in a fresh process. The first block to run a
command line runs it for real (the installed `vitdeploy`, with the block's flags as written, in the block's
folder) and its bundle, output and exit status are kept under the key of that command line (and, through
tests/artifact_cache.py, the project's source and library versions); a later identical line gets a copy and
the same output. A failing export is never kept: its block fails as it would without this.

Only exports whose source is a built-in model (or the default one) are served from the cache: their result
depends on nothing in the block's folder. Anything else, an output folder that already exists (the CLI then
carries engines over) or another command, runs the real CLI.

Usage: tests/test_docs.py puts a `vitdeploy` script that runs this file first on the blocks' PATH, with
DOCS_EXPORT_CACHE naming the cache folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

CACHE_ENV = "DOCS_EXPORT_CACHE"
REAL_CLI = Path(sys.executable).with_name("vitdeploy")
OUTPUT_FLAGS = ("-o", "--output")


class ExportFailed(Exception):
    def __init__(self, run: subprocess.CompletedProcess) -> None:
        super().__init__(run.returncode)
        self.run = run


def split_output(args: list[str]) -> tuple[str | None, list[str]]:
    """(the -o/--output value, the other arguments in order); None when absent or given twice."""
    output, rest, i = None, [], 0
    while i < len(args):
        arg = args[i]
        value = None
        if arg in OUTPUT_FLAGS and i + 1 < len(args):
            value, i = args[i + 1], i + 2
        elif arg.startswith("--output="):
            value, i = arg.split("=", 1)[1], i + 1
        elif arg.startswith("-o") and len(arg) > 2 and not arg.startswith("--"):
            value, i = arg[2:], i + 1
        else:
            rest.append(arg)
            i += 1
            continue
        if output is not None:
            return None, args
        output = value
    return output, rest


def cacheable(args: list[str], cwd: Path) -> tuple[str, list[str]] | None:
    """(output folder, key arguments) when this command line may be served from the cache, else None."""
    if not args or args[0] != "export" or any(a in ("--help", "-h") for a in args):
        return None
    output, rest = split_output(args[1:])
    if output is None or (cwd / output).exists():
        return None
    # the source comes first, or is absent (the CLI's default); a source-like word anywhere else is not
    # understood here, so it is left to the real CLI, as is any path in the block's folder
    given = rest[:1] if rest and not rest[0].startswith("-") else []
    if given and not given[0].startswith("builtin:"):
        return None
    if any(":" in a for a in rest[len(given):]) or any((cwd / a).exists() for a in rest):
        return None
    return output, rest


def main(args: list[str]) -> int:
    cwd = Path.cwd()
    served = cacheable(args, cwd) if os.environ.get(CACHE_ENV) else None
    if served is None:
        os.execv(str(REAL_CLI), [str(REAL_CLI), *args])
    output, key_args = served
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from artifact_cache import ArtifactCache

    env = dict(os.environ)

    def build(folder: Path) -> None:
        run = subprocess.run([str(REAL_CLI), *args[:1], *key_args, "-o", str(folder / "bundle")], cwd=cwd, env=env,
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if run.returncode != 0:
            raise ExportFailed(run)
        (folder / "output.json").write_text(json.dumps({"stdout": run.stdout, "stderr": run.stderr}))

    # the key leaves out the block's own (empty, offline) hub cache folder: a built-in source never reads it
    os.environ.pop("HF_HOME", None)
    try:
        folder = ArtifactCache(Path(env[CACHE_ENV])).get(["docs-cli-export", key_args], build, label=f"vitdeploy export {key_args}")
    except ExportFailed as failed:
        sys.stdout.write(failed.run.stdout)
        sys.stderr.write(failed.run.stderr)
        return failed.run.returncode
    shutil.copytree(folder / "bundle", cwd / output)
    recorded = json.loads((folder / "output.json").read_text())
    sys.stdout.write(recorded["stdout"].replace(str(folder / "bundle"), str(cwd / output)))
    sys.stderr.write(recorded["stderr"].replace(str(folder / "bundle"), str(cwd / output)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
