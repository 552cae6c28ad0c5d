"""The layout rules, checked on the source with ``ast`` (from the issues "Planner layout: a
structure a newcomer can read" and "Estimators and service in layers").

In ``planner/``, ``service/`` and ``estimators/``:

a. No import cycles between files, so each file can be read after the ones it imports
   (imports inside ``if TYPE_CHECKING:`` never run and do not count).
b. No file uses another file's private names (a single leading underscore), neither
   imported by name nor through a module: private means "only this file relies on it".
c. No reaching into another object's private attributes: only ``self._x`` and ``cls._x``.
   A third-party module's private API (its root name imported from outside our packages)
   is its owner's business; a third-party object's private API that cannot be avoided
   is marked on its line with ``# layout: allow-private (the reason)``.
d. No file over 400 lines and no function over 100: past that a file or function is
   usually two ideas.

In ``estimators/`` and ``service/``, whose subpackages are the rooms' jobs or layers:

f. A subpackage imports only the subpackages :data:`ALLOWED_IMPORTS` lists for it (lazy
   imports inside functions count): collecting imports neither applying nor measuring,
   and the service's layers import only downwards. Every subpackage and top-level module
   has its row, so a new one is placed on purpose.
g. What one subpackage takes from a sibling is listed in the sibling's ``__init__.__all__``:
   the rest of a subpackage is its own business. ``estimators/__init__.py`` exports
   lazily only names its subpackages list.

In ``tests/`` and ``bench/``:

e. Tests and benchmarks use the public surface: no private names imported or reached
   through one of our modules, and no monkeypatch target naming one by string.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("planner", "service", "estimators")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 100
_SERVICE_LEAVES = ("config", "errors", "examples", "lazy", "metrics", "schemas", "text", "times", "version")
# f.: for each room, each subpackage (or top-level module) and the others it may import.
ALLOWED_IMPORTS: dict[str, dict[str, frozenset[str]]] = {
    "estimators": {
        "common": frozenset(),  # what every job shares
        "collect": frozenset({"common"}),
        "apply": frozenset({"common"}),
        "measure": frozenset({"common"}),
        "cli": frozenset({"common", "collect", "apply", "measure"}),  # the top: verify applies plans, measures
    },
    # The service's rooms, each above the ones it may import; the shared leaves at the bottom.
    "service": {
        "main": frozenset({"api", "docs", "views", "solving", "store", "transport", *_SERVICE_LEAVES}),
        "cli": frozenset({"store", "transport", *_SERVICE_LEAVES}),  # the app only as "service.main:create_app"
        "api": frozenset({"views", "solving", "store", "transport", *_SERVICE_LEAVES}),
        "docs": frozenset({"views", "solving", "store", "transport", *_SERVICE_LEAVES}),  # api's sibling
        "views": frozenset({"solving", "store", "transport", *_SERVICE_LEAVES}),
        "solving": frozenset({"store", "transport", *_SERVICE_LEAVES}),
        "store": frozenset({"transport", *_SERVICE_LEAVES}),
        "transport": frozenset(_SERVICE_LEAVES),
        "config": frozenset(),
        "errors": frozenset(),
        "examples": frozenset(),
        "lazy": frozenset(),
        "metrics": frozenset(),
        "text": frozenset({"errors"}),
        "times": frozenset(),
        "version": frozenset(),
        "schemas": frozenset({"examples", "times"}),
    },
}
ALLOW_PRIVATE = re.compile(r"#\s*layout:\s*allow-private\s*\(\s*\S[^)]*\)")
PRIVATE_TARGET = re.compile(r"^(planner|service|estimators)(\.\w+)*\._[a-zA-Z]\w*$")


@dataclass(frozen=True, eq=False)
class Source:
    """One parsed file: where it is, its dotted module name, its syntax tree and lines."""

    rel: str
    module: str
    is_package: bool
    tree: ast.Module
    lines: list[str]


@cache
def sources(*folders: str) -> list[Source]:
    out = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            text = path.read_text(encoding="utf-8")
            parts = rel.removesuffix(".py").split("/")
            is_package = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_package else parts)
            out.append(Source(rel, module, is_package, ast.parse(text, filename=rel), text.splitlines()))
    return out


@cache
def own_modules() -> frozenset[str]:
    return frozenset(src.module for src in sources(*PACKAGES))


def is_private(name: str) -> bool:  # one leading underscore: not a dunder
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_own(dotted: str) -> bool:
    return dotted.split(".")[0] in PACKAGES


def imports(src: Source, *, skip_type_checking: bool) -> Iterator[tuple[int, str, str | None, str, str]]:
    """Each import as (line, absolute module, name taken from it or None, name bound, what that name names)."""
    stack: list[ast.AST] = [src.tree]
    while stack:
        node = stack.pop()
        test = node.test if isinstance(node, ast.If) else None
        if skip_type_checking and getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                yield node.lineno, alias.name, None, alias.asname or top, alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = src.module.split(".") if src.is_package else src.module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                yield node.lineno, base, alias.name, alias.asname or alias.name, f"{base}.{alias.name}".lstrip(".")


def import_target(module: str, name: str | None) -> str | None:
    """The own file an import loads: ``module.name`` when that is a file, else ``module`` (or its package)."""
    if name and f"{module}.{name}" in own_modules():
        return f"{module}.{name}"
    while module and module not in own_modules():
        module = module.rpartition(".")[0]
    return module or None


def attribute_chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None when the chain does not start at a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


@cache
def import_bindings(src: Source) -> dict[str, str]:
    """Each name an import binds -> the dotted thing it names (``dp`` -> "planner.dp")."""
    return {bound: names for *_, bound, names in imports(src, skip_type_checking=False)}


def resolve(src: Source, node: ast.AST) -> str | None:
    """What an expression like ``dp`` or ``planner.dp`` names, when its root name is imported."""
    chain = attribute_chain(node)
    root = import_bindings(src).get(chain[0]) if chain else None
    return ".".join([root, *chain[1:]]) if root is not None else None


def private_attributes(src: Source) -> Iterator[tuple[int, str, str]]:
    """Each ``x._name`` outside ``self``/``cls`` as (line, "module" or "object", what), third-party roots left out."""
    for node in ast.walk(src.tree):
        if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
            continue
        if attribute_chain(node.value) in (["self"], ["cls"]):
            continue
        named = resolve(src, node.value)
        if named is not None and not is_own(named):
            continue  # a third-party module's private API
        if named in own_modules():
            yield node.lineno, "module", f"uses {named}.{node.attr}, private to that file"
        else:
            yield node.lineno, "object", f"reaches into {ast.unparse(node)}"


def private_imports(src: Source) -> Iterator[tuple[int, str]]:
    """Each ``from own.module import _name`` of another file, as (line, what)."""
    for line, module, name, *_ in imports(src, skip_type_checking=False):
        if name is not None and is_private(name) and is_own(module) and module != src.module:
            yield line, f"imports {name} from {module}, private to that file"


def is_attribute_call(node: ast.AST) -> bool:
    """``setattr(x, "name", ...)``, ``monkeypatch.setattr(x, "name", ...)``, likewise getattr, delattr."""
    if not (isinstance(node, ast.Call) and len(node.args) >= 2):
        return False
    func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    return func in ("setattr", "getattr", "delattr")


def report(violations: list[str], rule: str) -> str:
    def place(violation: str) -> tuple[str, int]:
        path, line, _ = (violation + "::").split(":", 2)
        return path, int(line) if line.isdigit() else 0

    return f"{len(violations)} {rule}:\n" + "\n".join(sorted(violations, key=place))


def test_no_import_cycles():
    files = {src.module: src for src in sources(*PACKAGES)}
    edges: dict[str, dict[str, int]] = {m: {} for m in files}
    for src in files.values():
        for line, module, name, *_ in imports(src, skip_type_checking=True):
            target = import_target(module, name)
            if target is not None and target != src.module:
                edges[src.module].setdefault(target, line)

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reach = {m: reachable(m) for m in files}
    cycles, placed = [], set()
    for m in files:
        if m in reach[m] and m not in placed:
            members = sorted(n for n in reach[m] if m in reach[n])
            placed.update(members)
            lines = [f"  {files[a].rel}:{line}: imports {b}"
                     for a in members for b, line in edges[a].items() if b in members]
            cycles.append(f"import cycle among {', '.join(files[n].rel for n in members)}:\n" + "\n".join(lines))
    assert not cycles, report(cycles, "import cycles")


def test_no_private_names_across_files():
    violations = [f"{src.rel}:{line}: {what}" for src in sources(*PACKAGES) for line, what in private_imports(src)]
    violations += [f"{src.rel}:{line}: {what}" for src in sources(*PACKAGES)
                   for line, kind, what in private_attributes(src) if kind == "module"]
    assert not violations, report(violations, "uses of another file's private names")


def test_no_private_attributes_of_other_objects():
    violations = [f"{src.rel}:{line}: {what}" for src in sources(*PACKAGES) for line, kind, what in private_attributes(src)
                  if kind == "object" and not ALLOW_PRIVATE.search(src.lines[line - 1])]
    rule = "private attributes of other objects (only self._x and cls._x; else '# layout: allow-private (reason)')"
    assert not violations, report(violations, rule)


def test_file_and_function_sizes():
    violations = [f"{src.rel}:{len(src.lines)}: {len(src.lines)} lines, over {MAX_FILE_LINES}"
                  for src in sources(*PACKAGES) if len(src.lines) > MAX_FILE_LINES]
    for src in sources(*PACKAGES):
        for node in ast.walk(src.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    violations.append(f"{src.rel}:{node.lineno}: {node.name} has {length} lines, "
                                      f"over {MAX_FUNCTION_LINES}")
    assert not violations, report(violations, "files or functions too long")


def test_tests_and_benchmarks_use_public_names():
    violations = []
    for src in sources("tests", "bench"):
        violations += [f"{src.rel}:{line}: {what}" for line, what in private_imports(src)]
        violations += [f"{src.rel}:{line}: {what}" for line, kind, what in private_attributes(src) if kind == "module"]
        for node in ast.walk(src.tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and PRIVATE_TARGET.match(node.value):
                violations.append(f"{src.rel}:{node.lineno}: names the private {node.value!r} by string")
            elif is_attribute_call(node) and resolve(src, node.args[0]) in own_modules() \
                    and isinstance(node.args[1], ast.Constant) and is_private(str(node.args[1].value)):
                target = f"{resolve(src, node.args[0])}.{node.args[1].value}"
                violations.append(f"{src.rel}:{node.lineno}: names the private {target!r} by string")
    assert not violations, report(violations, "uses of private names from tests or benchmarks")


def unit_of(module: str) -> tuple[str, str] | None:
    """(room, subpackage or top-level module) of a dotted module in a layered room; None for the room itself."""
    parts = module.split(".")
    if parts[0] not in ALLOWED_IMPORTS or len(parts) < 2:
        return None
    return parts[0], parts[1]


@cache
def exported(package: str) -> frozenset[str] | None:
    """The names a subpackage's ``__init__.__all__`` lists; None for a plain module."""
    path = ROOT / package.replace(".", "/") / "__init__.py"
    if not path.exists():
        return None
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def test_every_subpackage_has_its_row_in_the_import_table():
    missing = []
    for room, table in ALLOWED_IMPORTS.items():
        units = {unit_of(src.module)[1] for src in sources(room) if unit_of(src.module)}
        missing += [f"{room}/{u}" for u in sorted(units - set(table))]
        missing += [f"{room}: the table names {u!r}, which is not there" for u in sorted(set(table) - units)]
        missing += [f"{room}/{u} may import {v!r}, which is not there" for u, vs in table.items() for v in vs - units]
    assert not missing, report(missing, "subpackages without a row in ALLOWED_IMPORTS (or rows without one)")


def test_subpackages_import_only_what_the_table_allows():
    violations = []
    for room in ALLOWED_IMPORTS:
        for src in sources(room):
            unit = unit_of(src.module)
            if unit is None:
                continue
            for line, module, name, *_ in imports(src, skip_type_checking=True):
                target = unit_of(import_target(module, name) or "")
                if target is not None and target[1] != unit[1] and target[1] not in ALLOWED_IMPORTS[room][unit[1]]:
                    violations.append(f"{src.rel}:{line}: {room}/{unit[1]} imports {room}/{target[1]}, "
                                      f"which ALLOWED_IMPORTS does not let it")
    assert not violations, report(violations, "imports against the table of allowed imports")


def test_siblings_take_only_the_names_a_subpackage_exports():
    violations = []
    for room in ALLOWED_IMPORTS:
        for src in sources(room):
            unit = unit_of(src.module)
            for line, module, name, *_ in imports(src, skip_type_checking=False):
                target = unit_of(module)
                if unit is None or target is None or target[1] == unit[1]:
                    continue
                package = f"{room}.{target[1]}"
                names = exported(package)
                taken = name if name is not None else module.split(".")[2] if module.count(".") >= 2 else None
                if names is not None and taken is not None and taken not in names:
                    violations.append(f"{src.rel}:{line}: takes {taken} from {module}, which {package}.__all__ "
                                      f"does not list")
    assert not violations, report(violations, "names taken from a sibling subpackage that it does not export")


def test_the_estimators_facade_exports_only_what_its_subpackages_list():
    tree = ast.parse((ROOT / "estimators" / "__init__.py").read_text(encoding="utf-8"))
    where = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "_WHERE" for t in node.targets))
    violations = [f"estimators/__init__.py: {name} from {package}, which {package}.__all__ does not list"
                  for name, package in where.items() if name not in (exported(package) or ())]
    assert not violations, report(violations, "facade names a subpackage does not export")
