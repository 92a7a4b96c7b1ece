"""The options many commands share (vitdeploy/cli/options.py): one gate, one set of names, -v/-q, --json (issue 37)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from vitdeploy.cli import main
from vitdeploy.cli.common import command
from vitdeploy.cli.options import gate_option_names, gate_options, json_option
from vitdeploy.gate import Gate

GATED_COMMANDS = ("check", "calibrate", "convert", "debug-precision")
OLD_NAMES = ("--cosine-min", "--top1-min", "--min-agreement", "--max-drop")


def _help(*args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


def _gate_records(name: str) -> dict[str, tuple[str, str]]:
    """option name as --help shows it -> (its names and metavar, its help with the default), for the gate's options."""
    cmd = main.commands[name]
    ctx = click.Context(cmd, info_name=name)
    records = {}
    for param in cmd.params:
        record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
        if record and record[0].split()[0] in gate_option_names(parity=True):
            records[record[0].split()[0]] = record
    return records


def test_gate_options_are_named_the_same_in_every_command() -> None:
    task = gate_option_names()
    assert task == ["--min-cosine", "--min-top1-agreement", "--max-accuracy-drop"]
    records = {cmd: _gate_records(cmd) for cmd in GATED_COMMANDS}
    for cmd in GATED_COMMANDS:
        assert [n for n in records[cmd] if n in task] == task, (cmd, records[cmd])
        assert {n: records[cmd][n] for n in task} == {n: records["check"][n] for n in task}, cmd  # same words, same defaults
        text = _help(cmd)
        for name in task:
            assert name in text, (cmd, name)
        for old in OLD_NAMES:  # accepted, never shown
            assert old not in text, (cmd, old)
    assert "--fp32-max-abs" in records["check"]  # fp32 parity: the command that judges fp32 graphs
    assert "[default: 0.99;" in records["check"]["--min-cosine"][1] and "[default: 1.0;" in records["check"]["--max-accuracy-drop"][1]


def _gate_probe():
    @command("gate-probe")
    @gate_options(parity=True)
    @json_option()
    def probe(gate: Gate, as_json: bool) -> None:
        """Print the gate it was given."""
        click.echo(repr(gate))

    return probe


@pytest.mark.parametrize("args, expected", [
    ([], Gate()),
    (["--min-cosine", "0.5", "--min-top1-agreement", "0.7", "--max-accuracy-drop", "2", "--fp32-max-abs", "1e-3"],
     Gate(min_cosine=0.5, min_agreement=0.7, max_drop_points=2.0, fp32_max_abs=1e-3)),
    (["--cosine-min", "0.5", "--top1-min", "0.7", "--max-drop", "2"], Gate(min_cosine=0.5, min_agreement=0.7, max_drop_points=2.0)),
    (["--min-agreement", "0.8"], Gate(min_agreement=0.8)),
])
def test_old_spellings_still_set_the_gate(args: list[str], expected: Gate) -> None:
    result = CliRunner().invoke(_gate_probe(), args)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == repr(expected)


@pytest.mark.parametrize("cmd", GATED_COMMANDS)
def test_out_of_range_thresholds_are_usage_errors(cmd: str, tmp_path: Path) -> None:
    """One range per threshold in every command (calibrate once took any float): one line, exit 2, nothing run."""
    for args in (["--min-agreement", "1.01"], ["--min-top1-agreement", "-0.1"], ["--min-cosine", "1.5"], ["--max-accuracy-drop", "-2"]):
        result = CliRunner().invoke(main, [cmd, str(tmp_path), *args, *(["--precision", "int8"] if cmd == "debug-precision" else [])])
        assert result.exit_code == 2, (cmd, args, result.output)
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "is not in the range" in errors[0] and "Traceback" not in result.output, result.output


def test_every_command_declares_gate_aliases_on_one_option() -> None:
    """The old names are spellings of the same option (one value, one default), in each gated command."""
    for name in GATED_COMMANDS:
        cmd = main.commands[name]
        options = {p.name: p for p in cmd.params if isinstance(p, click.Option)}
        assert set(options["min_cosine"].opts) == {"--min-cosine", "--cosine-min"}
        assert set(options["min_agreement"].opts) == {"--min-top1-agreement", "--top1-min", "--min-agreement"}
        assert set(options["max_drop_points"].opts) == {"--max-accuracy-drop", "--max-drop"}
        assert options["min_cosine"].default == Gate().min_cosine and options["max_drop_points"].default == Gate().max_drop_points


def test_json_is_one_shared_option() -> None:
    with_json = [name for name, cmd in main.commands.items() if any(p.name == "as_json" for p in cmd.params)]
    assert len(with_json) >= 10, with_json
    for name in with_json:
        opt = next(p for p in main.commands[name].params if p.name == "as_json")
        assert opt.opts == ["--json"] and opt.is_flag and opt.help.startswith("Print"), name


def _log_probe():
    log = logging.getLogger("vitdeploy.tests.probe")

    @command("log-probe")
    @json_option()
    def probe(as_json: bool) -> None:
        """Log at every level, then print a result."""
        log.debug("a debug detail")
        log.info("a progress line")
        log.warning("a warning")
        click.echo("the result")

    return probe


@pytest.fixture
def log_probe():
    probe = _log_probe()
    main.add_command(probe)
    yield
    main.commands.pop("log-probe")


def test_verbosity_of_the_group(log_probe) -> None:
    def lines(*args: str) -> list[str]:
        result = CliRunner().invoke(main, list(args))
        assert result.exit_code == 0, result.output
        return result.output.splitlines()

    assert lines("log-probe") == ["a progress line", "warning: a warning", "the result"]
    assert lines("-v", "log-probe") == ["debug: tests.probe: a debug detail", "a progress line", "warning: a warning", "the result"]
    assert lines("-q", "log-probe") == ["warning: a warning", "the result"]
    assert lines("log-probe", "--json") == ["warning: a warning", "the result"]  # stdout is the JSON: no progress lines
    assert lines("-v", "log-probe", "--json")[0] == "debug: tests.probe: a debug detail"
    assert lines("log-probe") == ["a progress line", "warning: a warning", "the result"]  # each invocation starts afresh


def test_quiet_keeps_errors(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["-q", "export", "-o", str(tmp_path / "b"), "--precision", "int8"])
    assert result.exit_code != 0
    assert [line for line in result.output.splitlines() if line.startswith("error:")], result.output


@pytest.mark.slow  # two exports of the digits model (about 10 s of CPU)
def test_verbose_and_quiet_export(tmp_path: Path) -> None:
    runner = CliRunner()
    verbose = runner.invoke(main, ["-v", "export", "-o", str(tmp_path / "v")])
    assert verbose.exit_code == 0, verbose.output
    debug = [line for line in verbose.stderr.splitlines() if line.startswith("debug: exporters.api: ")]
    assert any("input 32x32, static: the model's native size" in line for line in debug), verbose.stderr
    assert any(re.search(r"wrote model.onnx \([\d,]+ bytes\) in [\d.]+ s", line) for line in debug), verbose.stderr
    assert any(re.search(r"took [\d.]+ s in all", line) for line in debug), verbose.stderr
    assert "exported with torch.onnx" in verbose.stderr  # the progress lines as well
    assert verbose.stdout.strip().startswith("bundle written:")

    quiet = runner.invoke(main, ["-q", "export", "-o", str(tmp_path / "q")])
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == "" and quiet.stdout.strip().splitlines() == [f"bundle written: {tmp_path / 'q'} (fp32)"]
