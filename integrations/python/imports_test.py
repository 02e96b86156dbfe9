"""The cma package's structure, read as source (torch is not needed):

  * its imports run one way: no cycle among its modules, counting the
    imports inside functions (a lazy import that closes a cycle is still
    one). `import a.b` and `from a import b` count as an edge to the module
    they name (a.b), not to its parents: every submodule's import runs its
    package's __init__ first, which is no dependency of the submodule's;
  * every attribute cma.torch sets on PyTorch's objects is set by
    cma/torch/_patches.py (the registry with install and uninstall);
  * no library source file (.py, .cc, .h) is over 650 lines.
"""
import ast
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "cma")
MAX_LINES = 650


def modules(root):
    """{dotted name: path} of every .py file under the package `root`."""
    base = os.path.dirname(root)
    out = {}
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                parts = os.path.relpath(path, base)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                out[".".join(parts)] = path
    return out


def _is_package(path):
    return os.path.basename(path) == "__init__.py"


def imports(name, path, known):
    """The modules of `known` that module `name` (at `path`) imports."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = name if _is_package(path) else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = base + "." + a.name
                out.add(sub if sub in known else base)
    return {m for m in out if m in known and m != name}


def graph(root):
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def find_cycle(edges):
    """One import cycle as a list of modules (first == last), or None."""
    state = {}  # name -> 1 on the stack, 2 done

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m, stack)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n, [])
            if found:
                return found
    return None


def test_the_package_was_found():
    g = graph(PACKAGE)
    assert {"cma", "cma._lib", "cma.torch", "cma.torch.training.step_in_backward"} <= set(g), \
        sorted(g)
    # Lazy imports count: the hints import the step during backward inside a function.
    assert "cma.torch.training.step_in_backward" in g["cma.torch.training.hints"]


def test_no_import_cycle():
    cycle = find_cycle(graph(PACKAGE))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from p import a\n")
    (pkg / "a.py").write_text("def f():\n    from p.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\nimport os\n")
    g = graph(str(pkg))
    assert g["p.sub.b"] == {"p.a"} and g["p.a"] == {"p.sub.b"}, g
    assert find_cycle(g) in (["p.a", "p.sub.b", "p.a"], ["p.sub.b", "p.a", "p.sub.b"])
    (pkg / "sub" / "b.py").write_text("import os\n")
    assert find_cycle(graph(str(pkg))) is None


def _torch_names(tree):
    """Names a module binds to torch or to something imported from it."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    names.add(a.asname or "torch")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names.update(a.asname or a.name for a in node.names)
    return names


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def monkeypatches(path):
    """(line, text) of each attribute set on a torch object: `torch.x.y = v`,
    `setattr(torch.x, ...)`."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source, path)
    torch_names = _torch_names(tree)
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            targets = [t for t in targets if isinstance(t, ast.Attribute)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("setattr", "delattr") and node.args:
            targets = [node.args[0]]
        for t in targets:
            if _root(t) in torch_names:
                found.append((node.lineno, ast.get_source_segment(source, node)))
    return sorted(found)


def test_every_monkeypatch_is_in_the_registry():
    outside = []
    for name, path in sorted(modules(PACKAGE).items()):
        if name != "cma.torch._patches":
            outside += ["%s:%d: %s" % (name, line, text) for line, text in monkeypatches(path)]
    assert not outside, "set on torch outside cma/torch/_patches.py:\n" + "\n".join(outside)


def test_the_monkeypatch_finder_finds_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import torch\nimport torch.nn.utils as u\nfrom torch.utils import data\n"
                 "torch.Tensor.to = None\nsetattr(u, 'x', 1)\ndata.DataLoader.__init__ = 2\n"
                 "other.x = 3\n")
    assert [line for line, _ in monkeypatches(str(f))] == [4, 5, 6]


def test_no_library_file_is_over_650_lines():
    long = []
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith((".py", ".cc", ".h")):
                path = os.path.join(folder, f)
                with open(path, encoding="utf-8") as fh:
                    n = sum(1 for _ in fh)
                if n > MAX_LINES:
                    long.append("%s: %d lines" % (os.path.relpath(path, HERE), n))
    assert not long, "\n".join(long)


if __name__ == "__main__":
    args = [__file__, "-q", "-p", "no:cacheprovider"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    sys.exit(pytest.main(args))
