"""The package's layout, read from its source (nothing imported): the rules of docs/design.md's
"Layers" that a change could quietly break.

* no import cycle among ringq's modules (imports inside functions count; imports only for type
  checkers, under ``if TYPE_CHECKING:``, do not);
* only ``ringq/engine/`` imports the compiled modules (``_native``, the cffi helper; ``_jobs``,
  the job builder; ``_guard``, the queue and writer locks' entry and exit);
* the layers depend one way: the top-level modules (the public types, errors, codec, the backend
  interface) import no subpackage except where the public API names a class that lives in one
  (``ringq/__init__.py``, ``connect.py``, ``__main__.py``), and neither backend imports the other;
* no class has two or more mixin bases, and no module imports another's private name.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "ringq"


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PKG.rglob("*.py")}
PACKAGES = {_module(p) for p in PKG.rglob("__init__.py")}
COMPILED = ("_native", "_jobs", "_guard")  # the compiled modules of ringq/engine/


def _typing_only(tree: ast.Module) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _absolute(module: str, level: int, name: str | None) -> str:
    if not level:
        return name or ""
    base = module.split(".") if module in PACKAGES else module.split(".")[:-1]
    base = base[: len(base) - level + 1]
    return ".".join(base + ([name] if name else []))


def _owner(target: str) -> str | None:
    """The ringq module an imported dotted name belongs to (the longest prefix that is one)."""
    while target:
        if target in MODULES:
            return target
        target = target.rpartition(".")[0]
    return None


class Imports:
    def __init__(self) -> None:
        self.edges: dict[str, set[str]] = {m: set() for m in MODULES}
        self.native: set[str] = set()
        self.private: list[str] = []
        self.mixins: list[str] = []
        for module, path in MODULES.items():
            tree = ast.parse(path.read_text())
            skip = _typing_only(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                    if sum(b.endswith(("Methods", "Mixin")) for b in bases) >= 2:
                        self.mixins.append(f"{module}.{node.name}")
                if getattr(node, "lineno", 0) in skip:
                    continue
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        self._edge(module, alias.name)
                elif isinstance(node, ast.ImportFrom):
                    base = _absolute(module, node.level, node.module)
                    for alias in node.names:
                        full = f"{base}.{alias.name}"
                        self._edge(module, full if full in MODULES or alias.name in COMPILED else base)
                        if (alias.name.startswith("_") and not alias.name.startswith("__")
                                and alias.name not in COMPILED
                                and full not in MODULES and base in MODULES and base != module):
                            self.private.append(f"{module} imports {alias.name} from {base}")

    def _edge(self, module: str, target: str) -> None:
        if target.split(".")[-1] in COMPILED and target.startswith("ringq"):
            self.native.add(module)
            return
        owner = _owner(target)
        if owner is not None and owner != module:
            self.edges[module].add(owner)

    def cycles(self) -> list[list[str]]:
        """Strongly connected components of more than one module (Tarjan, iteratively)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        on_stack: set[str] = set()
        stack: list[str] = []
        found: list[list[str]] = []
        counter = 0
        for root in self.edges:
            if root in index:
                continue
            work = [(root, iter(sorted(self.edges[root])))]
            index[root] = low[root] = counter
            counter += 1
            stack.append(root)
            on_stack.add(root)
            while work:
                node, children = work[-1]
                child = next(children, None)
                if child is not None:
                    if child not in index:
                        index[child] = low[child] = counter
                        counter += 1
                        stack.append(child)
                        on_stack.add(child)
                        work.append((child, iter(sorted(self.edges[child]))))
                    elif child in on_stack:
                        low[node] = min(low[node], index[child])
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
        return found


@pytest.fixture(scope="module")
def imports() -> Imports:
    return Imports()


def test_no_import_cycles(imports):
    assert imports.cycles() == []


def test_only_the_engine_imports_the_compiled_helper(imports):
    assert imports.native and all(m.startswith("ringq.engine.") for m in imports.native), sorted(imports.native)


def test_the_top_level_imports_no_layer_above_it(imports):
    allowed = {"ringq": {"ringq.local.queue", "ringq.engine.recovery", "ringq.worker.worker"},
               "ringq.connect": {"ringq.local.queue", "ringq.redis.queue"},
               "ringq.__main__": {"ringq.cli", "ringq.cli.main"}}
    for module, targets in imports.edges.items():
        if MODULES[module].parent != PKG:
            continue  # a module of a subpackage
        upward = {t for t in targets if MODULES[t].parent != PKG} - allowed.get(module, set())
        assert not upward, f"{module} imports {sorted(upward)}"


def test_neither_backend_imports_the_other(imports):
    for module, targets in imports.edges.items():
        if module.startswith("ringq.redis."):
            assert not any(t.startswith(("ringq.local.", "ringq.engine.")) for t in targets), (module, targets)
        if module.startswith(("ringq.local.", "ringq.engine.")):
            assert not any(t.startswith("ringq.redis.") for t in targets), (module, targets)


def test_no_mixin_hosts_and_no_private_imports(imports):
    assert imports.mixins == []
    assert imports.private == []
