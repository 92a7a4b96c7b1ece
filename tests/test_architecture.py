"""The import graph keeps the shape docs/DESIGN.md draws (issue 28): no circles, nothing imported from a
higher layer, no private names taken from another module, no module over 500 lines.

Imports are read with `ast` from the source (imports inside functions included), resolved to the
project's modules as they install (`exporters/` is vitdeploy.exporters, `calibration/` is
vitdeploy.calibration). The layers are read from the ```layers block of docs/DESIGN.md, so the picture
and the rule are one text.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREES = {"vitdeploy": REPO / "vitdeploy", "vitdeploy.exporters": REPO / "exporters", "vitdeploy.calibration": REPO / "calibration"}
MAX_LINES = 500


def modules() -> dict[str, Path]:
    out = {}
    for package, base in TREES.items():
        for path in sorted(base.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


MODULES = modules()


def _targets(module: str, node: ast.AST) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) for one import statement of ``module``."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [(target, alias.name) for alias in node.names]


def _own(name: str) -> str | None:
    """The project module an import names (the longest prefix that is one), or None for a library."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_edges() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    edges: dict[str, set[str]] = defaultdict(set)
    private: list[tuple[str, str, str]] = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target, name in _targets(module, node):
                submodule = f"{target}.{name}" if name else None
                own = _own(submodule) if submodule in MODULES else _own(target)
                if own is None or own == module:
                    continue
                edges[module].add(own)
                if name and name.startswith("_") and not name.startswith("__") and submodule not in MODULES:
                    private.append((module, own, name))
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(edges) | {w for targets in edges.values() for w in targets}):
        if v not in index:
            visit(v)
    return found


def layers() -> list[list[str]]:
    """The ```layers block of docs/DESIGN.md: one layer per line, top first, module prefixes separated by
    spaces (a prefix names a module or everything below a package)."""
    text = (REPO / "docs" / "DESIGN.md").read_text()
    match = re.search(r"```layers\n(.*?)```", text, re.S)
    assert match, "docs/DESIGN.md has no ```layers block"
    rows = []
    for line in match.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            rows.append(line.split())
    return rows


def layer_of(module: str, table: list[list[str]]) -> int:
    """Index of the layer whose longest prefix matches ``module`` (0 is the top)."""
    best, best_len = None, -1
    for i, row in enumerate(table):
        for prefix in row:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    assert best is not None, f"{module} is in no layer of docs/DESIGN.md"
    return best


def test_no_import_cycles() -> None:
    found = cycles(import_edges()[0])
    assert found == [], "import cycles (imports inside functions included):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_nothing_is_imported_from_a_higher_layer() -> None:
    table = layers()
    edges, _ = import_edges()
    upward = sorted(f"{a} (layer {layer_of(a, table)}) -> {b} (layer {layer_of(b, table)})"
                    for a, targets in edges.items() for b in targets if layer_of(b, table) < layer_of(a, table))
    assert upward == [], "imports that run up the layers of docs/DESIGN.md:\n" + "\n".join(upward)


def test_every_module_is_in_a_layer() -> None:
    table = layers()
    for module in MODULES:
        layer_of(module, table)


def test_no_private_names_across_modules() -> None:
    _, private = import_edges()
    assert private == [], "private names imported from another module:\n" + "\n".join(f"{a} takes {n} from {b}" for a, b, n in private)


def test_no_module_over_500_lines() -> None:
    long = sorted(f"{path.relative_to(REPO)}: {n}" for path in MODULES.values()
                  if (n := len(path.read_text().splitlines())) > MAX_LINES)
    assert long == [], f"modules over {MAX_LINES} lines (split them along their jobs):\n" + "\n".join(long)


def test_the_checker_sees_a_cycle_and_an_upward_import() -> None:
    """The checker itself: a planted cycle and a planted upward import are found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    table = [["vitdeploy.cli"], ["vitdeploy.runtime"], ["vitdeploy"]]
    assert layer_of("vitdeploy.runtime.ort", table) == 1 and layer_of("vitdeploy.bundle", table) == 2
    assert layer_of("vitdeploy.cli.common", table) < layer_of("vitdeploy.runtime.ort", table)


# -- the accuracy gate's thresholds are defined once: vitdeploy/gate.py (issue 37) ---------------------------------
GATE_HOME = "vitdeploy.gate"  # the Gate dataclass and its defaults
GATE_OPTIONS_HOME = "vitdeploy.cli.options"  # the one declaration of the gate's CLI options
# Names a threshold of the gate goes by (current and past), as identifiers and as CLI options.
GATE_THRESHOLD_NAMES = {"min_cosine", "cosine_min", "min_agreement", "top1_min", "min_top1_agreement", "max_drop", "max_drop_points",
                        "max_accuracy_drop", "accuracy_drop_max", "fp32_max_abs", "fp32_min_cosine", "fp32_feature_cosine_min"}
GATE_OPTION_NAMES = {"--min-cosine", "--cosine-min", "--min-top1-agreement", "--top1-min", "--min-agreement", "--max-accuracy-drop",
                     "--max-drop", "--fp32-max-abs"}
# Same-named tolerances that are not the accuracy gate, each with why.
NOT_THE_GATE = {
    ("vitdeploy.exporters.cpu_fused", "COSINE_MIN"): "model.cpu.onnx against the plain fp32 graph: the same maths reordered",
    ("vitdeploy.engine.lowering", "FP32_MAX_ABS"): "the lowered 8.x fp32 graph against the bundle's fp32 graph",
    ("vitdeploy.cli.cmd_evaluate", "--max-drop"): "evaluate's flag for agreement lost under a shift, not a gate of a graph",
}


def _literal_number(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


def gate_definitions(module: str, source: str) -> list[str]:
    """Places in ``source`` that define a threshold of the gate a second time: a number bound to a threshold's
    name (a constant, a dataclass field, a parameter default, a keyword argument), a CLI option declared
    under a gate option's name, or another class named Gate."""
    found = []
    for node in ast.walk(ast.parse(source)):
        bound: list[tuple[str | None, ast.AST]] = []
        if isinstance(node, ast.Assign):
            bound += [(getattr(t, "id", None) or getattr(t, "attr", None), node.value) for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            bound.append((getattr(node.target, "id", None) or getattr(node.target, "attr", None), node.value))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args.posonlyargs + node.args.args
            bound += [(a.arg, d) for a, d in zip(args[len(args) - len(node.args.defaults):], node.args.defaults)]
            bound += [(a.arg, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None]
        elif isinstance(node, ast.Call):
            bound += [(k.arg, k.value) for k in node.keywords if k.arg]
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func == "option":
                found += [f"{module}:{node.lineno} declares the option {a.value}" for a in node.args
                          if isinstance(a, ast.Constant) and a.value in GATE_OPTION_NAMES and (module, a.value) not in NOT_THE_GATE]
        elif isinstance(node, ast.ClassDef) and node.name == "Gate":
            found.append(f"{module}:{node.lineno} defines another class Gate")
        found += [f"{module}:{node.lineno} sets {name} = {ast.unparse(value)}" for name, value in bound
                  if name and name.lower() in GATE_THRESHOLD_NAMES and _literal_number(value) and (module, name) not in NOT_THE_GATE]
    return found


def test_gate_thresholds_are_defined_once() -> None:
    found = [line for module, path in MODULES.items() if module not in (GATE_HOME, GATE_OPTIONS_HOME)
             for line in gate_definitions(module, path.read_text())]
    assert found == [], ("the gate's thresholds are defined in vitdeploy/gate.py (its options in vitdeploy/cli/options.py); "
                         "take a Gate instead:\n" + "\n".join(found))
    home = gate_definitions(GATE_HOME, MODULES[GATE_HOME].read_text())
    assert any("sets min_cosine = 0.99" in line for line in home), home  # the checker sees the one definition


def test_the_gate_checker_sees_a_second_definition() -> None:
    planted = '''
import click
COSINE_MIN = 0.99
class Options:
    top1_min: float = 0.99
def gate(x, max_drop=-1.0): ...
run(Limits(min_agreement=0.9))
@click.option("--max-accuracy-drop", type=float)
def cmd(): ...
class Gate: ...
'''
    found = gate_definitions("planted", planted)
    assert sorted(line.split(" ", 1)[1] for line in found) == sorted([
        "sets COSINE_MIN = 0.99", "defines another class Gate", "sets top1_min = 0.99", "sets max_drop = -1.0",
        "sets min_agreement = 0.9", "declares the option --max-accuracy-drop"]), found


# -- the precision registry (issue 37): precision names are listed in one place ----------------------------------
PRECISION_HOME = "vitdeploy.precisions"


def precision_name_lists(source: str, names: set[str]) -> list[tuple[int, list[str]]]:
    """(line, names) of every list, tuple or set literal in ``source`` holding two or more precision names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            held = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
            if len(held) >= 2:
                found.append((node.lineno, held))
    return found


def test_precision_names_are_listed_only_in_the_registry() -> None:
    """No list/tuple/set of precision names outside vitdeploy/precisions.py: choices, orders, flag maps and
    file names read the registry, so a new precision is one entry there (tests may list them)."""
    from vitdeploy import precisions

    names = set(precisions.NAMES)
    assert names >= {"fp32", "fp16", "int8"}
    offenders = [f"{path.relative_to(REPO)}:{line}: {held}" for module, path in MODULES.items() if module != PRECISION_HOME
                 for line, held in precision_name_lists(path.read_text(), names)]
    assert offenders == [], "precision names listed outside the registry (read vitdeploy.precisions):\n" + "\n".join(offenders)


def test_the_precision_rule_sees_a_list() -> None:
    names = {"fp32", "fp16", "int8"}
    planted = 'A = ("fp32", "fp16")\nB = ["best", "int8", "x"]\nC = {"int8", "fp16"}\nD = ("auto", "cpu", "cuda")\nE = f(("fp16",))\n'
    assert precision_name_lists(planted, names) == [(1, ["fp32", "fp16"]), (3, ["int8", "fp16"])]


def test_package_docstrings_list_every_module() -> None:
    """engine/, profile/ and calibration/ describe their modules in __init__'s docstring: every one of them."""
    missing = []
    for package in ("vitdeploy.engine", "vitdeploy.profile", "vitdeploy.calibration"):
        doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
        for module in MODULES:
            if module.startswith(package + ".") and module.count(".") == package.count(".") + 1:
                stem = module.rsplit(".", 1)[1]
                if not re.search(rf"(?<![\w.])\.?{stem}\b", doc):
                    missing.append(f"{package}: {stem}")
    assert missing == [], "modules the package docstring does not list:\n" + "\n".join(missing)


# -- one home per family decision (issue 37, item 2) ------------------------------------------------
# What a model family does is answered by its adapter (exporters/adapters/). Outside that package no
# code tests which family a model is: no comparison (==, !=, in, startswith/endswith) on a ``family``,
# ``model_type`` or ``architecture`` value, none against a family adapter's name or a transformers
# model type, and no isinstance against a timm or transformers model class.
ADAPTERS = REPO / "exporters" / "adapters"
FAMILY_FIELDS = {"family", "model_type", "architecture"}


def family_names() -> set[str]:
    """The adapters' registry names and transformers model types, read from the adapter classes' bodies."""
    names: set[str] = set()
    for path in sorted(ADAPTERS.glob("*.py")):
        bodies = [cls.body for cls in ast.walk(ast.parse(path.read_text())) if isinstance(cls, ast.ClassDef)]
        for node in (statement for body in bodies for statement in body):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ("name", "model_types") for t in node.targets):
                names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str))
    names.discard("")
    return names


def _names_a_family_field(expr: ast.AST) -> bool:
    """``x.family``, ``family``, ``config.model_type``, ``source.get("model_type")``, ``d["architecture"]`` ..."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Attribute) and node.attr in FAMILY_FIELDS:
            return True
        if isinstance(node, ast.Name) and node.id in FAMILY_FIELDS:
            return True
        if isinstance(node, ast.Constant) and node.value in FAMILY_FIELDS:  # a key: .get("model_type"), ["family"]
            return True
    return False


def _library_classes(tree: ast.AST) -> set[str]:
    """Names a module imports from timm.models or transformers (its model classes)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("timm", "transformers") \
                and (node.module or "").startswith(("timm.models", "transformers")):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def family_tests(source: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, text) of every test of a model's family in ``source`` (see the block comment above)."""
    tree = ast.parse(source)
    classes = _library_classes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_names_a_family_field(o) for o in operands) or any(
                    isinstance(c, ast.Constant) and c.value in known for o in operands for c in ast.walk(o)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("startswith", "endswith") \
                and _names_a_family_field(node.func.value):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2:
            kinds = node.args[1]
            named = {n.id for n in ast.walk(kinds) if isinstance(n, ast.Name)}
            dotted = ast.unparse(kinds)
            if named & classes or dotted.startswith(("timm.", "transformers.")):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_family_test_outside_the_adapters() -> None:
    known = family_names()
    assert {"timm-vit", "hf-dinov2", "dinov2", "reference-vit"} <= known, f"the adapters' names were not found: {sorted(known)}"
    offending = []
    for module, path in MODULES.items():
        if ADAPTERS in path.parents:
            continue
        offending += [f"{path.relative_to(REPO)}:{line}: {text}" for line, text in family_tests(path.read_text(), known)]
    assert offending == [], ("family decisions outside exporters/adapters/ (ask loaded.adapter, or add the answer to "
                             "the family's adapter):\n" + "\n".join(offending))


def test_the_family_rule_sees_each_kind_of_test() -> None:
    """The checker itself: each way of testing a family is found; a source-kind test and a plain use are not."""
    planted = '''
from timm.models.beit import Beit
if loaded.family == "timm":
    pass
if config.model_type != "x":
    pass
if source.get("model_type") in ("a", "b"):
    pass
if loaded.family.startswith("timm"):
    pass
if isinstance(model, Beit):
    pass
if name == "hf-dinov2":
    pass
if kind == "timm":
    pass
label = spec.architecture
'''
    lines = [line for line, _ in family_tests(planted, {"hf-dinov2"})]
    assert sorted(lines) == [3, 5, 7, 9, 11, 13]


# -- typed manifest records (issue 37 item 4): consumers read records, not the JSON layout ------------------------
# The manifest's artifact, engine and storage records and the weights identity are read and written through
# vitdeploy/records.py (Bundle.artifact/artifacts/engines/weights/storage; records.set_artifact/set_engines/
# set_storage); only the reader, the records and the bundle know where they live in the JSON.
RECORD_HOMES = {"vitdeploy.manifest", "vitdeploy.records", "vitdeploy.bundle"}
RECORD_KEYS = {"artifacts", "engines", "storage"}
# Receivers whose "artifacts" is another JSON: check.json's list of scored graphs (checks/report, report/*).
OTHER_JSON = {"report", "rec.data", "d"}
# Modules not migrated yet, each with its reason: the next session finishes them and empties this.
NOT_MIGRATED: dict[str, str] = {}


def raw_record_reads(source: str) -> list[tuple[int, str]]:
    """(line, text) of every read or write of a record's JSON key: ``X.get("artifacts")``, ``X["engines"]`` ...,
    and the weights record under a manifest's source (``source.get("weights")``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "setdefault") \
                and node.args and isinstance(node.args[0], ast.Constant):
            receiver, key = node.func.value, node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            receiver, key = node.value, node.slice.value
        else:
            continue
        text = ast.unparse(receiver)
        if (key in RECORD_KEYS and text not in OTHER_JSON) or (key == "weights" and any(w in text for w in ("source", "recorded", "manifest"))):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_manifest_records_are_read_through_vitdeploy_records() -> None:
    """No `.get("artifacts")`, `["engines"]`, `["storage"]` or `source.get("weights")` outside the reader, the
    records and the bundle: a consumer asks `bundle.artifact("fp16").sha256`, `bundle.engines()`, `bundle.weights`,
    and a writer hands a record to `records.set_artifact` & co."""
    offenders = []
    for module, path in MODULES.items():
        if module in RECORD_HOMES or module in NOT_MIGRATED:
            continue
        offenders += [f"{path.relative_to(REPO)}:{line}: {text}" for line, text in raw_record_reads(path.read_text())]
    assert offenders == [], ("manifest records read as raw JSON (use the typed records of vitdeploy/records.py):\n"
                             + "\n".join(offenders))
    for module in NOT_MIGRATED:  # an exemption that is no longer needed is removed
        assert raw_record_reads(MODULES[module].read_text()), f"{module} reads no raw record any more: drop it from NOT_MIGRATED"


def test_the_record_rule_sees_each_kind_of_read() -> None:
    planted = '''
sha = old.get("artifacts", {}).get("fp32", {}).get("sha256")
for target in bundle.manifest["engines"]:
    pass
manifest["storage"] = {"external_data_threshold": 0}
seed = (source.get("weights") or {}).get("seed")
merged.setdefault("engines", {})
for art in report["artifacts"]:
    pass
fp = fingerprint.get("weights")
x = record.sha256
'''
    found = sorted(line for line, _ in raw_record_reads(planted))
    assert found == [2, 3, 5, 6, 7], raw_record_reads(planted)
