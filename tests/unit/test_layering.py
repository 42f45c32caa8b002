"""The package's layering, read from the source (every import: top level, inside functions, and
under TYPE_CHECKING), so that a cycle or a wrong-way import fails here, not in a reader's head.

- no import cycles between stream_dapo modules (a package counts as its __init__);
- the pure layers (core/, the buffer's state machine: replay, fleet, queue, policy; transport/) never
  import the configuration: they take parameter objects built from it (`from_section`,
  `Config.admission_policy`);
- nothing outside cli/ imports argparse: a command's arguments live in its cli/ module;
- the generator and learner services never see the whole configuration: their composition roots
  (`generator/root.py`, `learner/root.py`) read it and hand them settings and collaborators;
- runtime/ (what every service shares) imports no service, tool or command.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "stream_dapo"


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def resolve(name: str) -> str:
    """The module a dotted import names: itself, or the nearest package above it that exists."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports_of(path: Path) -> set[str]:
    """Every stream_dapo module and every top-level library `path` imports, anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("stream_dapo"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in MODULES else resolve(node.module))
            else:
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found.add(
                    resolve(alias.name) if alias.name.startswith("stream_dapo") else alias.name.split(".")[0]
                )
    return found


GRAPH = {name: {d for d in imports_of(path) if d in MODULES and d != name} for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
        for w in graph[v]:
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert len(MODULES) > 100  # the walk found the package
    assert cycles(GRAPH) == []


PURE = (
    "stream_dapo.core",
    "stream_dapo.buffer.replay",
    "stream_dapo.buffer.fleet",
    "stream_dapo.buffer.queue",
    "stream_dapo.buffer.policy",
    "stream_dapo.transport",
)


@pytest.mark.parametrize("layer", PURE)
def test_pure_layers_do_not_import_the_configuration(layer: str) -> None:
    offenders = {
        name: sorted(
            d for d in GRAPH[name] if d == "stream_dapo.config" or d.startswith("stream_dapo.config.")
        )
        for name in MODULES
        if name == layer or name.startswith(layer + ".") or name.startswith(layer + "_")
    }
    assert offenders, f"no module under {layer}"
    assert {k: v for k, v in offenders.items() if v} == {}


SERVICES_BUILT_BY_A_ROOT = ("stream_dapo.generator.service", "stream_dapo.learner.service")


def config_names_used(path: Path) -> set[str]:
    """The names `path` takes from stream_dapo.config ("*" for the module itself), and "cfg" if any
    name, argument or attribute in it is called so."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("stream_dapo.config")
        ):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import) and any(
            a.name.startswith("stream_dapo.config") for a in node.names
        ):
            found.add("*")
        elif (
            (isinstance(node, ast.Name) and node.id == "cfg")
            or (isinstance(node, ast.arg) and node.arg == "cfg")
            or (isinstance(node, ast.Attribute) and node.attr == "cfg")
        ):
            found.add("cfg")
    return found


def test_the_rule_on_configuration_names_sees_an_import_and_a_cfg(tmp_path: Path) -> None:
    path = tmp_path / "service.py"
    path.write_text("from stream_dapo.config import Config, GeneratorConfig\ndef f(cfg): return cfg.run\n")
    assert config_names_used(path) == {"Config", "GeneratorConfig", "cfg"}
    path.write_text("class S:\n    def f(self): return self.cfg.run\n")
    assert config_names_used(path) == {"cfg"}


@pytest.mark.parametrize("service", SERVICES_BUILT_BY_A_ROOT)
def test_services_take_settings_from_their_composition_root_not_the_configuration(service: str) -> None:
    """They may name the config sections their settings hold whole, never the `Config` tree nor a
    `cfg` (issue 39: narrow inputs, so tests and benchmarks inject instead of patching)."""
    used = config_names_used(MODULES[service])
    assert used & {"Config", "load_config", "*", "cfg"} == set()
    assert all(name.endswith("Config") for name in used), sorted(used)


def test_only_cli_parses_arguments() -> None:
    parsing = sorted(
        name
        for name, path in MODULES.items()
        if "argparse" in imports_of(path) and not name.startswith("stream_dapo.cli")
    )
    assert parsing == []


def test_runtime_imports_no_service_tool_or_command() -> None:
    above = ("generator", "buffer", "learner", "tools", "cli", "model", "data", "verifier", "weights")
    wrong = {
        name: sorted(d for d in GRAPH[name] if d.partition(".")[2].split(".")[0] in above)
        for name in MODULES
        if name.startswith("stream_dapo.runtime.")
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_library_never_imports_the_test_helpers() -> None:
    users = sorted(
        name
        for name in MODULES
        if not name.startswith("stream_dapo.testing")
        and any(d == "stream_dapo.testing" or d.startswith("stream_dapo.testing.") for d in GRAPH[name])
    )
    assert users == []


def test_bench_never_reaches_into_tests() -> None:
    bench = PKG.parent / "bench"
    scripts = sorted(bench.rglob("*.py"))
    assert len(scripts) > 20
    reaching = sorted(str(p.relative_to(bench)) for p in scripts if "tests" in imports_of(p))
    assert reaching == []
