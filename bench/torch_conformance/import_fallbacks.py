"""Lets PyTorch's newer test_cuda.py import against an older installed torch
without editing the file: before pytest imports it, every name it imports
from a module (`from torch.testing._internal.X import A, B`) that the
installed module lacks is set on that module as a stand-in.

Stand-ins are conservative: a missing capability flag (TEST_*, IS_*,
PLATFORM_SUPPORTS_*, *OrLater) is False; a missing decorator skips the test
it decorates, with a reason naming the missing name, except for a few that
only restore global settings or mark scheduling (IDENTITY_DECORATORS), which
leave the test as it is. apply() returns what it did, for the results file:
the lead must see which tests ran on a stand-in.
"""
import ast
import functools
import importlib
import sys
import types
import unittest

# Decorators whose absence changes no test's meaning: they mark a test as
# serial, or restore a global setting afterwards.
IDENTITY_DECORATORS = {
    "serialTest": "factory",             # @serialTest()
    "recover_orig_fp32_precision": "direct",
    "setBlasBackendsToDefaultFinally": "direct",
    "gcIfJetson": "direct",
}


def missing_reason(name):
    return f"{name} is missing from the installed torch (conformance harness stand-in)"


class MissingName:
    """A stand-in for a missing helper. As a decorator (called with one
    function or class) it skips what it decorates; called any other way it
    returns itself, so @missing(...) works as a decorator factory. It is falsy,
    and any attribute other than a dunder skips the running test."""

    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (callable(args[0]) or isinstance(args[0], type)):
            return skip_decorated(args[0], missing_reason(self._name))
        return self

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise unittest.SkipTest(missing_reason(self._name))

    def __repr__(self):
        return f"<missing {self._name}>"


def skip_decorated(obj, reason):
    if isinstance(obj, type):
        return unittest.skip(reason)(obj)

    @functools.wraps(obj)
    def skipped(*args, **kwargs):
        raise unittest.SkipTest(reason)
    return skipped


def _identity_factory(*args, **kwargs):
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return lambda fn: fn


def _torch_cuda_version():
    cuda = getattr(getattr(sys.modules.get("torch"), "version", None), "cuda", None)
    if not cuda:
        return (0, 0)
    return tuple(int(x) for x in cuda.split(".")[:2])


def stand_in(name):
    """(value, kind): what replaces a missing name, and a word saying how."""
    if name in IDENTITY_DECORATORS:
        return _identity_factory, "identity decorator"
    if name == "_get_torch_cuda_version":
        return _torch_cuda_version, "torch.version.cuda"
    if (name.startswith(("TEST_", "IS_", "PLATFORM_SUPPORTS_", "HAS_"))
            or name.endswith("OrLater")):
        return False, "False"
    if name.endswith("_ARCH"):
        return (), "empty tuple"
    if name.endswith("_db"):
        return [], "empty list"
    if name.startswith("Test") and name[4:5].isupper():
        base = type(name, (unittest.TestCase,), {
            "setUp": lambda self: self.skipTest(missing_reason(name))})
        return base, "skipping TestCase"
    return MissingName(name), "skips what uses it"


class MissingDependency(ImportError):
    pass


def imports_of(source):
    """(module, [names]) of every top-level `from M import a, b` of `source`."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names if a.name != "*"]))
    return found


def apply(source, prefixes=("torch",), importer=importlib.import_module):
    """Installs stand-ins for the names `source` imports from modules under
    `prefixes` that are missing. A module that does not exist is replaced by
    an empty one holding stand-ins; one that exists but needs a package that
    is not installed raises MissingDependency. Returns a list of
    {"module", "name", "stand_in"} for every stand-in installed."""
    applied = []
    for module_name, names in imports_of(source):
        if not module_name.split(".")[0] in prefixes:
            continue
        try:
            module = importer(module_name)
        except ImportError as e:
            missing = getattr(e, "name", None)
            if missing and not (module_name + ".").startswith(missing + "."):
                # The module exists but needs a package this machine lacks:
                # standing in for all of it would skip every test silently.
                raise MissingDependency(
                    f"{module_name} needs the package {missing!r}, which is not installed "
                    f"(add a stand-in under shims/ or install it)") from e
            module = types.ModuleType(module_name)
            sys.modules[module_name] = module
            applied.append({"module": module_name, "name": "*",
                            "stand_in": f"empty module ({e})"})
        for name in names:
            if hasattr(module, name):
                continue
            value, kind = stand_in(name)
            setattr(module, name, value)
            applied.append({"module": module_name, "name": name, "stand_in": kind})
    return applied
