"""python -m cma.torch and CMA_TORCH (cma_torch.pth, cma/_torch_start.py)
without torch: a fake `torch` package (a folder on sys.path whose
__init__.py records that it ran) and a fake `cma.torch` (put in sys.modules
before anything imports it, its use_as_default recording each call) stand
in for them; everything else is the real code. Each case runs in a fresh
interpreter, as the launcher and the .pth line do.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cma import _torch_start  # noqa: E402

PTH = os.path.join(HERE, "cma_torch.pth")

# Run first in each child: the fake cma.torch. Its __path__ is the real
# package's, so that cma.torch.__main__ (the launcher) is the real one.
FAKE_CMA_TORCH = textwrap.dedent("""
    import importlib.machinery, os, sys, types
    import cma
    fake = types.ModuleType("cma.torch")
    fake.__path__ = [os.path.join(os.path.dirname(cma.__file__), "torch")]
    fake.__spec__ = importlib.machinery.ModuleSpec("cma.torch", None, is_package=True)
    fake.__spec__.submodule_search_locations = fake.__path__
    fake.calls = []
    def use_as_default(config=None):
        torch = sys.modules.get("torch")
        fake.calls.append({"config": config, "argv": list(sys.argv),
                           "torch_complete": bool(getattr(torch, "COMPLETE", False)),
                           "torch_imported": torch is not None})
    fake.use_as_default = use_as_default
    sys.modules["cma.torch"] = fake
    cma.torch = fake
""")

FAKE_TORCH = """\
import sys
IMPORTS = getattr(sys, "_fake_torch_imports", 0) + 1
sys._fake_torch_imports = IMPORTS  # how many times this file ran
COMPLETE = True                    # the last line: set once torch has finished importing
"""

# The script the launcher runs: what it sees, as JSON on stdout.
SCRIPT = textwrap.dedent("""
    import json, sys
    calls = sys.modules["cma.torch"].calls
    print("REPORT " + json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
                                  "main_is_this": sys.modules["__main__"].__dict__ is globals(),
                                  "calls": calls}))
    if len(sys.argv) > 1 and sys.argv[1] == "exit3":
        sys.exit(3)
""")


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "fake" / "torch").mkdir(parents=True)
    (tmp_path / "fake" / "torch" / "__init__.py").write_text(FAKE_TORCH)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text(SCRIPT)
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "trainmod.py").write_text(SCRIPT)
    (tmp_path / "site").mkdir()
    shutil.copy(PTH, tmp_path / "site" / "cma_torch.pth")
    return tmp_path


def child(tree, code, env=None, args=()):
    environ = {k: v for k, v in os.environ.items() if k != "CMA_TORCH"}
    environ["PYTHONPATH"] = os.pathsep.join([str(tree / "fake"), str(tree / "mods"), HERE])
    environ.update(env or {})
    return subprocess.run([sys.executable, "-c", code, *args], cwd=str(tree), env=environ,
                          capture_output=True, text=True, timeout=60)


def report(proc):
    lines = [l for l in proc.stdout.splitlines() if l.startswith("REPORT ")]
    assert len(lines) == 1, (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(lines[0][len("REPORT "):])


def launch(tree, *argv, env=None):
    """`python -m cma.torch argv...`, with the fake cma.torch."""
    code = FAKE_CMA_TORCH + textwrap.dedent("""
        import runpy
        sys.argv = ["cma.torch"] + sys.argv[1:]
        runpy.run_module("cma.torch", run_name="__main__", alter_sys=True)
    """)
    return child(tree, code, env, argv)


# ---------------------------------------------------------------- the launcher

@pytest.mark.parametrize("argv, want", [
    (["train.py"], (None, "path", "train.py", [])),
    (["train.py", "--conf", "x", "-m", "y"], (None, "path", "train.py", ["--conf", "x", "-m", "y"])),
    (["--conf", "max_split_size_mb:64", "train.py", "a"],
     ("max_split_size_mb:64", "path", "train.py", ["a"])),
    (["--conf=oversubscribe:1", "-m", "pkg.mod", "--lr", "1"],
     ("oversubscribe:1", "module", "pkg.mod", ["--lr", "1"])),
    (["-mpkg.mod", "a"], (None, "module", "pkg.mod", ["a"])),
    (["--", "-odd.py", "a"], (None, "path", "-odd.py", ["a"])),
])
def test_arguments(argv, want):
    assert _torch_start.parse(argv) == want


@pytest.mark.parametrize("argv", [[], ["--conf"], ["--conf", "x"], ["-m"], ["--bogus", "t.py"],
                                  ["-h"]])
def test_usage_errors(argv):
    with pytest.raises(_torch_start.UsageError):
        _torch_start.parse(argv)


def test_the_script_runs_as_main_after_use_as_default(tree):
    proc = launch(tree, "--conf", "max_split_size_mb:64", "scripts/train.py", "a", "--conf", "b")
    assert proc.returncode == 0, proc.stderr
    r = report(proc)
    assert r["name"] == "__main__" and r["main_is_this"], r
    assert r["argv"] == ["scripts/train.py", "a", "--conf", "b"], r
    assert r["path0"] == str(tree / "scripts"), r  # as `python scripts/train.py` puts it
    assert [c["config"] for c in r["calls"]] == ["max_split_size_mb:64"], r


def test_a_module_runs_as_main(tree):
    proc = launch(tree, "-m", "trainmod", "x")
    assert proc.returncode == 0, proc.stderr
    r = report(proc)
    assert r["name"] == "__main__" and r["main_is_this"], r
    assert r["argv"] == [str(tree / "mods" / "trainmod.py"), "x"], r  # as python -m sets it
    assert [c["config"] for c in r["calls"]] == [None], r


def test_the_scripts_exit_status_is_the_processs(tree):
    proc = launch(tree, "scripts/train.py", "exit3")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)


def test_a_usage_error_says_how_and_runs_nothing(tree):
    proc = launch(tree, "--conf")
    assert proc.returncode == 2 and "usage: python -m cma.torch" in proc.stderr, proc.stderr
    assert "REPORT" not in proc.stdout


# ---------------------------------------------------------------- CMA_TORCH

PTH_THEN_IMPORT = FAKE_CMA_TORCH + textwrap.dedent("""
    import json, site
    site.addsitedir(os.path.join(os.getcwd(), "site"))   # processes cma_torch.pth
    hooked = "cma._torch_start" in sys.modules
    import torch
    import torch
    print("REPORT " + json.dumps({"calls": fake.calls, "hooked": hooked,
                                  "torch_ran": sys._fake_torch_imports}))
""")


@pytest.mark.parametrize("value, configs", [
    ("1", [None]), ("yes", [None]), ("oversubscribe:1", ["oversubscribe:1"]),
    ("0", []), ("", []),
])
def test_the_pth_line_makes_cma_the_allocator_when_torch_is_imported(tree, value, configs):
    proc = child(tree, PTH_THEN_IMPORT, {"CMA_TORCH": value} if value is not None else {})
    assert proc.returncode == 0, proc.stderr
    r = report(proc)
    assert [c["config"] for c in r["calls"]] == configs, r
    assert all(c["torch_complete"] for c in r["calls"]), r  # after torch, not inside it
    assert r["torch_ran"] == 1, r
    assert r["hooked"] == (value != ""), r  # the line imports nothing where the variable is unset


def test_the_pth_file_is_one_import_line():
    with open(PTH) as f:
        lines = [l for l in f.read().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("import "), lines


def test_torch_imported_by_cma_torch_itself_waits_for_it(tree):
    # A package that imports torch first and defines use_as_default after it,
    # as cma.torch does: the hook runs when the package has finished.
    (tree / "mods" / "pkg_first.py").write_text(
        "import torch\nimport sys\ncalls = []\n"
        "def use_as_default(config=None):\n"
        "    calls.append(config)\n")
    code = textwrap.dedent("""
        import json, sys
        from cma import _torch_start
        hook = _torch_start.install_from_env({"CMA_TORCH": "c:1"}, package="pkg_first")
        import pkg_first
        print("REPORT " + json.dumps({"calls": pkg_first.calls, "done": hook.done,
                                      "left": hook in sys.meta_path}))
    """)
    proc = child(tree, code)
    assert proc.returncode == 0, proc.stderr
    assert report(proc) == {"calls": ["c:1"], "done": True, "left": False}, proc.stderr
    assert "could not become" not in proc.stderr, proc.stderr


def test_torch_imported_already_is_served_at_once(tree):
    code = FAKE_CMA_TORCH + textwrap.dedent("""
        import json, torch
        from cma import _torch_start
        _torch_start.install_from_env({"CMA_TORCH": "1"})
        print("REPORT " + json.dumps({"calls": len(fake.calls)}))
    """)
    assert report(child(tree, code)) == {"calls": 1}


def test_a_failure_is_reported_and_torch_stays_imported(tree):
    code = FAKE_CMA_TORCH + textwrap.dedent("""
        import json
        def fail(config=None):
            raise RuntimeError("no compiler")
        fake.use_as_default = fail
        from cma import _torch_start
        _torch_start.install_from_env({"CMA_TORCH": "1"})
        import torch
        import torch
        print("REPORT " + json.dumps({"torch_ran": sys._fake_torch_imports}))
    """)
    proc = child(tree, code)
    assert report(proc) == {"torch_ran": 1}, proc.stderr
    assert "no compiler" in proc.stderr and "could not become PyTorch's allocator" in proc.stderr


@pytest.mark.parametrize("value, want", [
    ("", (False, None)), ("0", (False, None)), ("off", (False, None)), ("1", (True, None)),
    ("TRUE", (True, None)), (" max_split_size_mb:8 ", (True, "max_split_size_mb:8")),
])
def test_the_variables_values(value, want):
    assert _torch_start.env_config(value) == want


if __name__ == "__main__":
    args = [__file__, "-q", "-p", "no:cacheprovider"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    sys.exit(pytest.main(args))
