"""The checks of the GPU route scripts (run in fresh processes by
torch_gpu_test.py): each records True when it holds, or a string saying how
it failed or what it raised, and the script prints them as JSON."""


def make_check(out, after=None):
    """A decorator factory: @check("name") runs the function at once and
    records its outcome in `out`; `after` (if any) runs after each check."""
    def check(name):
        def wrap(fn):
            try:
                r = fn()
                out[name] = True if r is True else f"failed: {r!r}"
            except Exception as e:  # noqa: BLE001 - reported, the test fails on it
                out[name] = f"raised {type(e).__name__}: {str(e).splitlines()[0][:300]}"
            if after is not None:
                after()
            return fn
        return wrap
    return check
