"""The package's layout is a rule, not a habit: the modules at its root are commands, core/ is the
library they share, no command imports another (a helper two commands need belongs in core/), and
core/ imports no task (a command passes it the task)."""

from __future__ import annotations

import ast

from conftest import PROJECT
from {{ cookiecutter.package }} import tasks

PACKAGE = PROJECT / "src" / tasks.__name__.split(".")[0]
COMMANDS = sorted([path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__"] + ["doctor"])


def imported_modules(path, source: str | None = None) -> set[str]:
    """The package's own modules that a file (or `source`, read as that file) imports, relatively
    (`from ..core import x`) or absolutely (`import pkg.train`, `from pkg import train`), as dotted
    names relative to the package root."""
    depth = len(path.relative_to(PACKAGE).parts) - 1  # 0 for a module at the root
    found = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            found.update(own for alias in node.names if (own := _own(alias.name)))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and _own(node.module) is not None:
            module = _own(node.module)
            if module:
                found.add(module)
            found.update(".".join(filter(None, [module, alias.name])) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            if node.level - 1 > depth:  # above the package
                continue
            base = list(path.relative_to(PACKAGE).parts[: depth - (node.level - 1)])
            module = [*base, *(node.module.split(".") if node.module else [])]
            if node.module:
                found.add(".".join(module))
            for alias in node.names:
                found.add(".".join([*module, alias.name]))
    return found


def _own(dotted: str) -> str | None:
    """`dotted` relative to the package root when it names the package or a module of it ('' for
    the package itself), else None."""
    if dotted == PACKAGE.name:
        return ""
    return dotted[len(PACKAGE.name) + 1 :] if dotted.startswith(f"{PACKAGE.name}.") else None


def test_relative_and_absolute_imports_are_both_read():
    source = (
        f"import json\nimport {PACKAGE.name}.train\nfrom {PACKAGE.name} import predict\n"
        f"from {PACKAGE.name}.evaluate import main\nfrom .core import config\nfrom . import bench_input\n"
    )
    assert imported_modules(PACKAGE / "parity.py", source) == {
        "train",
        "predict",
        "evaluate",
        "evaluate.main",
        "core",
        "core.config",
        "bench_input",
    }


def test_every_module_at_the_root_is_a_command():
    for name in COMMANDS:
        if name == "doctor":  # a package: python -m runs its __main__.py
            assert (PACKAGE / "doctor" / "__main__.py").is_file()
            continue
        source = (PACKAGE / f"{name}.py").read_text()
        assert 'if __name__ == "__main__":' in source, f"{name}.py is not a command: move it into core/"
    assert (PACKAGE / "core" / "__init__.py").is_file()


def test_no_command_imports_another_command():
    for path in [*PACKAGE.glob("*.py"), *(PACKAGE / "doctor").glob("*.py")]:
        own = "doctor" if path.parent.name == "doctor" else path.stem
        others = {name for name in COMMANDS if name != own}
        imported = {module.split(".")[0] for module in imported_modules(path)}
        assert not imported & others, f"{path.name} imports the command(s) {sorted(imported & others)}"


def test_the_library_imports_no_command():
    for path in (PACKAGE / "core").glob("*.py"):
        imported = {module.split(".")[0] for module in imported_modules(path)}
        assert not imported & set(COMMANDS), (
            f"core/{path.name} imports the command(s) {sorted(imported & set(COMMANDS))}"
        )


def test_the_library_imports_no_task():
    """core/ takes the task as an argument: a command loads the one its config names
    (`tasks.load(cfg.task)`) and passes it on. No module of core/ imports the tasks package, at the
    top or inside a function, or reaches for a process-wide current task."""
    for path in (PACKAGE / "core").glob("*.py"):
        imported = sorted(module for module in imported_modules(path) if module.split(".")[0] == "tasks")
        assert not imported, f"core/{path.name} imports {', '.join(imported)}; take the task as an argument"
        assert "tasks.current" not in path.read_text(), (
            f"core/{path.name} names tasks.current; take the task as an argument"
        )


def test_the_module_maps_name_every_module():
    """The package's docstring maps every command and core/'s every library module: a module added
    without its line there fails here."""
    import re

    def named(docstring: str) -> set[str]:
        """The names in the first column of the map: its indented lines, up to the gap before the text."""
        first_columns = [line.strip().split("  ")[0] for line in docstring.splitlines() if line.startswith("    ")]
        return {word for column in first_columns for word in re.findall(r"[a-z_]+", column)}

    package_doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()))
    core_doc = ast.get_docstring(ast.parse((PACKAGE / "core" / "__init__.py").read_text()))
    unnamed_commands = [name for name in COMMANDS if name not in named(package_doc)]
    assert not unnamed_commands, f"{PACKAGE.name}/__init__.py does not name the commands {unnamed_commands}"
    library = sorted(path.stem for path in (PACKAGE / "core").glob("*.py") if path.stem != "__init__")
    unnamed_library = [name for name in library if name not in named(core_doc)]
    assert not unnamed_library, f"core/__init__.py does not name the modules {unnamed_library}"


def core_rooms() -> dict[str, str]:
    """core/__init__.py's map: each library module -> its room (the unindented headings), in order."""
    import re

    rooms, room = {}, None
    for line in ast.get_docstring(ast.parse((PACKAGE / "core" / "__init__.py").read_text())).splitlines():
        if re.fullmatch(r"[a-z][a-z ]*", line):
            room = line
        elif room and line.startswith("    ") and not line.startswith("     "):
            for name in re.findall(r"[a-z_]+", line.strip().split("  ")[0]):
                rooms[name] = room
    return rooms


def test_the_rooms_of_core_import_only_the_rooms_above_them():
    """Each core module sits in one room of core/__init__.py's map, and imports (at the top or in a
    function) only modules of its own room or of the rooms above it: the architecture that map shows
    is the one the code has."""
    rooms = core_rooms()
    order = list(dict.fromkeys(rooms.values()))
    library = sorted(path.stem for path in (PACKAGE / "core").glob("*.py") if path.stem != "__init__")
    assert sorted(rooms) == library, f"core/__init__.py's rooms name {sorted(rooms)}, core/ has {library}"
    graph = {
        name.removeprefix("core."): {each.removeprefix("core.") for each in imports}
        for name, imports in core_imports().items()
    }
    upward = [
        f"core/{module}.py ({rooms[module]}) imports {imported} ({rooms[imported]})"
        for module in library
        for imported in sorted(graph[module])
        if order.index(rooms[imported]) > order.index(rooms[module])
    ]
    assert not upward, "a room imports a room below it: " + "; ".join(upward)


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of `graph` (module -> the modules it imports) as [a, b, ..., a], or [] when it has none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return []
        for imported in sorted(graph[module]):
            cycle = visit(imported, [*path, module])
            if cycle:
                return cycle
        done.add(module)
        return []

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return []


def core_imports() -> dict[str, set[str]]:
    """core/'s modules -> the core modules each imports, at the top or inside a function."""
    modules = {f"core.{path.stem}": path for path in (PACKAGE / "core").glob("*.py") if path.stem != "__init__"}
    return {name: imported_modules(path) & set(modules) - {name} for name, path in modules.items()}


def test_core_has_no_import_cycle():
    """A lazy import inside a function counts: a cycle hidden that way still ties both modules together."""
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    graph = core_imports()
    assert "core.errors" in graph["core.gcp"] and "core.gcp" in graph["core.config"]  # imports are read
    cycle = import_cycle(graph)
    assert not cycle, f"core's modules import each other in a cycle: {' -> '.join(cycle)}; move what they share"


def test_no_library_or_task_module_imports_a_command():
    """core/ and tasks/ are what the commands build on: a helper a task needs from a command (a corpus
    reader, a record type) moves into core/ or tasks/text/, never the other way round."""
    for path in [*(PACKAGE / "core").rglob("*.py"), *(PACKAGE / "tasks").rglob("*.py")]:
        imported = {module.split(".")[0] for module in imported_modules(path)}
        commands = sorted(imported & set(COMMANDS))
        assert not commands, f"{path.relative_to(PACKAGE)} imports the command(s) {commands}"
