"""cma as PyTorch's allocator for a script that does not know it (issue 50).

    python -m cma.torch [--conf CMA_ALLOC_CONF] script.py args...
    python -m cma.torch [--conf CMA_ALLOC_CONF] -m module args...
    torchrun --nproc-per-node=8 -m cma.torch train.py args...
    CMA_TORCH=1 python train.py              (or CMA_TORCH=<CMA_ALLOC_CONF>)

The launcher (main(), run by cma/torch/__main__.py) calls
cma.torch.use_as_default(conf) and then runs the script as
`python script.py args...` would: __name__ == "__main__", sys.argv ==
[script.py, args...], sys.path[0] the script's folder (runpy.run_path); or
the module as `python -m module args...` would (runpy.run_module with
alter_sys: sys.argv[0] is the module's file).

CMA_TORCH does the same for a process started any other way (torchrun
without -m, a notebook kernel, a job script): the wheel installs
cma_torch.pth into site-packages, whose one line imports this module when
the variable is set, and install_from_env() puts a finder on sys.meta_path
so that right after `torch` has been imported (before anything can
initialise CUDA) cma becomes its allocator: use_as_default(conf), where
conf is the variable's value (1, on, true, yes: CMA_ALLOC_CONF as it is; 0,
off, false, no or empty: nothing happens). Where `torch` is first imported
by cma.torch itself (`import cma.torch` before `import torch`), that
happens when cma.torch has finished importing. A script that calls
use_as_default() itself keeps working: the second call does nothing.
Processes the script starts with multiprocessing's spawn or forkserver
run it again without the launcher: they get cma only through CMA_TORCH.

This module imports neither torch nor cma.torch until it runs them, so the
.pth line costs nothing visible where the variable is unset.
"""
import os
import runpy
import sys

VARIABLE = "CMA_TORCH"
USAGE = """usage: python -m cma.torch [--conf CMA_ALLOC_CONF] script.py [args...]
       python -m cma.torch [--conf CMA_ALLOC_CONF] -m module [args...]
Makes cma PyTorch's CUDA allocator (cma.torch.use_as_default(CMA_ALLOC_CONF)),
then runs the script (or module) as python would, its arguments unchanged.
torchrun ... -m cma.torch script.py [args...] does it on every rank.
CMA_TORCH=1 (or CMA_TORCH=<CMA_ALLOC_CONF>) does it for any Python process
of an environment where the cma wheel is installed."""


class UsageError(ValueError):
    pass


def parse(argv):
    """(conf or None, "path" or "module", script or module, its arguments)
    from the launcher's arguments; UsageError when they name nothing to run.
    Options end at the script (or -m module): what follows is the script's."""
    conf, i = None, 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            raise UsageError("")
        if a == "--conf" or a.startswith("--conf="):
            if a == "--conf":
                if i + 1 >= len(argv):
                    raise UsageError("--conf needs a CMA_ALLOC_CONF string")
                conf, i = argv[i + 1], i + 2
            else:
                conf, i = a[len("--conf="):], i + 1
            continue
        if a == "-m" or (a.startswith("-m") and len(a) > 2):
            module = a[2:] if len(a) > 2 else (argv[i + 1] if i + 1 < len(argv) else "")
            if not module:
                raise UsageError("-m needs a module name")
            return conf, "module", module, argv[i + (1 if len(a) > 2 else 2):]
        if a == "--":
            i += 1
            break
        if a.startswith("-"):
            raise UsageError(f"unknown option {a}")
        break
    if i >= len(argv):
        raise UsageError("no script to run")
    return conf, "path", argv[i], argv[i + 1:]


def run(conf, kind, target, args, use_as_default):
    """use_as_default(conf), then the script or module as __main__."""
    use_as_default(conf)
    sys.argv = [target] + list(args)
    if kind == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    # `python script.py` puts the script's folder first on sys.path where
    # `python -m cma.torch` put the current one (neither with -P).
    if sys.path and not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    runpy.run_path(target, run_name="__main__")


def main(argv=None):
    """`python -m cma.torch ...`; returns the exit status for a usage error."""
    try:
        conf, kind, target, args = parse(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print((f"python -m cma.torch: {e}\n" if str(e) else "") + USAGE,
              file=sys.stderr if str(e) else sys.stdout)
        return 2 if str(e) else 0
    from cma.torch import use_as_default
    run(conf, kind, target, args, use_as_default)
    return 0


# ------------------------------------------------------------ CMA_TORCH


def env_config(value):
    """(on, conf) from CMA_TORCH's value: conf None keeps CMA_ALLOC_CONF."""
    v = (value or "").strip()
    if v.lower() in ("", "0", "off", "false", "no"):
        return False, None
    if v.lower() in ("1", "on", "true", "yes"):
        return True, None
    return True, v


def _initializing(name):
    spec = getattr(sys.modules.get(name), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


class _Hook:
    """A meta path finder that runs use_as_default(conf) once `torch` (and
    `package`, where that imports torch first) has finished importing. It
    finds nothing itself: it lends the other finders' specs a loader whose
    exec_module calls back when the module is complete."""

    def __init__(self, conf, package="cma.torch"):
        self.conf = conf
        self.package = package
        self.done = False
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in ("torch", self.package) or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            original(module)
            try:
                del loader.exec_module  # the loader's own again
            except AttributeError:
                pass
            self.loaded(fullname)
        try:
            loader.exec_module = exec_module
        except AttributeError:  # a loader that takes no attribute: left as it is
            pass
        return spec

    def loaded(self, name):
        """`name` has just finished executing."""
        if self.done:
            return
        if name == "torch" and _initializing(self.package):
            return  # torch imported by the package: its own end runs the hook
        if name == self.package and ("torch" not in sys.modules or _initializing("torch")):
            return
        self.activate()

    def activate(self):
        """use_as_default(conf), once. It runs inside an import, whose
        failure would unload a module that has run (torch cannot run twice
        in a process): an error is reported on stderr, and PyTorch keeps
        its own allocator."""
        self.done = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        try:
            use_as_default = getattr(__import__(self.package, fromlist=["use_as_default"]),
                                     "use_as_default")
            use_as_default(self.conf)
        except Exception:  # noqa: BLE001 - reported, see the docstring
            import traceback
            traceback.print_exc()
            print(f"cma.torch: {VARIABLE}={os.environ.get(VARIABLE, '')!r}: cma could not "
                  "become PyTorch's allocator (above); PyTorch's own serves this process",
                  file=sys.stderr)


def install_from_env(environ=None, package="cma.torch"):
    """What cma_torch.pth runs: with CMA_TORCH on, cma becomes PyTorch's
    allocator right after torch is imported (at once if it already is).
    Returns the hook, or None where the variable is off."""
    on, conf = env_config((os.environ if environ is None else environ).get(VARIABLE, ""))
    if not on:
        return None
    for finder in sys.meta_path:
        if isinstance(finder, _Hook):
            return finder
    hook = _Hook(conf, package)
    if "torch" in sys.modules and not _initializing("torch"):
        hook.activate()
    else:
        sys.meta_path.insert(0, hook)
    return hook
