"""cma/torch/_ipc.py on a fake torch (no torch or GPU here): while cma is
installed, multiprocessing.Queue.put of an object that may hold a CUDA
tensor pickles it in the caller, so cma's refusal (the fake reducer raises
it as cma's shareIpcHandle does) raises from put() and the queue goes on;
every other put goes to the feeder thread as in PyTorch, pickled once."""
import importlib
import importlib.machinery
import multiprocessing
import multiprocessing.queues
import multiprocessing.reduction
import os
import sys
import threading
import types
from collections import namedtuple

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cma  # noqa: E402

REFUSAL_TEXT = ("caching_managed_allocator does not support shareIpcHandle: managed memory "
                "has no CUDA IPC handle")


class Thing:
    def __init__(self, device="cpu", value=0):
        self.device = types.SimpleNamespace(type=device)
        self.value = value

    def __eq__(self, other):
        return (type(other) is type(self) and other.device.type == self.device.type
                and other.value == self.value)

    def __hash__(self):
        return id(self)


class Tensor(Thing):
    pass


class Parameter(Tensor):
    pass


class UntypedStorage(Thing):  # storages are no tensors
    pass


class TypedStorage(Thing):
    pass


def _fake_torch():
    torch = types.ModuleType("torch")
    torch.is_ipc_test_fake = True
    torch.cuda = types.SimpleNamespace(initialized=True)
    torch.cuda.is_initialized = lambda: torch.cuda.initialized
    torch.Tensor, torch.UntypedStorage, torch.TypedStorage = Tensor, UntypedStorage, TypedStorage
    torch.nn = types.SimpleNamespace(Parameter=Parameter)
    return torch


# Bazel runs this file as __main__, and pytest imports it again: both
# share one fake torch (the one cma.torch._ipc imported).
torch = sys.modules.get("torch")
if not getattr(torch, "is_ipc_test_fake", False):
    torch = sys.modules["torch"] = _fake_torch()
# cma.torch without its __init__ (which needs the real torch): its modules
# import from the real folder.
_pkg = types.ModuleType("cma.torch")
_pkg.__path__ = [os.path.join(os.path.dirname(cma.__file__), "torch")]
_pkg.__spec__ = importlib.machinery.ModuleSpec("cma.torch", None, is_package=True)
_pkg.__spec__.submodule_search_locations = _pkg.__path__
sys.modules["cma.torch"] = _pkg
_ipc = importlib.import_module("cma.torch._ipc")

REDUCED = []  # (thread name, value) of every fake tensor pickled


def _rebuild(cls, device, value):
    return cls(device, value)


def _reduce(t):
    REDUCED.append((threading.current_thread().name, t.value))
    if t.device.type == "cuda":  # as reductions.reduce_tensor under cma
        raise RuntimeError(REFUSAL_TEXT)
    return _rebuild, (type(t), t.device.type, t.value)


for _cls in (torch.Tensor, torch.nn.Parameter, torch.UntypedStorage, torch.TypedStorage):
    multiprocessing.reduction.ForkingPickler.register(_cls, _reduce)


class Holder:
    """A user object: the look cannot see inside it."""

    def __init__(self, value):
        self.value = value

    def __reduce__(self):
        Holder.reductions.append(threading.current_thread().name)
        return Holder, (self.value,)

    def __eq__(self, other):
        return type(other) is Holder and other.value == self.value


Pair = namedtuple("Pair", "a b")


@pytest.fixture
def installed():
    REDUCED.clear()
    Holder.reductions = []
    torch.cuda.initialized = True
    _ipc.install()
    yield
    _ipc.uninstall()


def cuda(value=1):
    return torch.Tensor("cuda", value)


def cpu(value=1):
    return torch.Tensor("cpu", value)


def roundtrip(q, obj):
    q.put(obj)
    return q.get(timeout=10)


def test_the_refusal_is_cma_s_message():
    # The C++ makes the message _ipc recognises: Unsupported("shareIpcHandle", ...)
    # prefixes "caching_managed_allocator does not support ".
    ext = os.path.join(os.path.dirname(cma.__file__), "torch", "_ext")
    with open(os.path.join(ext, "cuda_allocator.cc")) as f:
        assert '"caching_managed_allocator does not support ", std::string(method), ": "' in \
            f.read()
    with open(os.path.join(ext, "cuda_allocator.h")) as f:
        assert 'Unsupported("shareIpcHandle", kNoIpc)' in f.read()
    assert REFUSAL_TEXT.startswith(_ipc.REFUSAL)


@pytest.mark.parametrize("shape", ["alone", "tuple", "nested", "namedtuple", "in_object",
                                   "parameter", "storage", "set"])
@pytest.mark.parametrize("kind", ["Queue", "JoinableQueue"])
def test_a_cuda_tensor_raises_from_put_and_the_queue_goes_on(installed, shape, kind):
    t = cuda()
    obj = {"alone": t, "tuple": (1, t), "nested": [{"x": (0, [t])}], "namedtuple": Pair(1, t),
           "in_object": Holder([t]), "parameter": torch.nn.Parameter("cuda"),
           "storage": torch.UntypedStorage("cuda"), "set": {1, frozenset([t])}}[shape]
    q = getattr(multiprocessing, kind)()
    with pytest.raises(RuntimeError, match="does not support shareIpcHandle"):
        q.put(obj)
    assert REDUCED[-1][0] == threading.current_thread().name  # in the caller
    # Nothing of it reached the queue; what follows arrives, in order.
    q.put("next")
    q.put(cpu(7))
    assert q.get(timeout=10) == "next" and q.get(timeout=10) == cpu(7)


def test_plain_objects_go_to_the_feeder_as_in_pytorch(installed):
    q = multiprocessing.Queue()
    for obj in (3, "s", [1, 2, (3, 4.0)], {"a": [cpu(1), cpu(2)]}, Pair(1, "x"), None):
        assert roundtrip(q, obj) == obj
    assert REDUCED and all(name == "QueueFeederThread" for name, _ in REDUCED), REDUCED


def test_an_object_the_look_cannot_see_into_is_pickled_once_in_the_caller(installed):
    q = multiprocessing.Queue()
    got = roundtrip(q, Holder([cpu(5)]))
    assert got == Holder([cpu(5)]) and type(got) is Holder
    assert Holder.reductions == [threading.current_thread().name]  # once, not in the feeder
    assert REDUCED == [(threading.current_thread().name, 5)]


def _echo(q, back):
    obj = q.get(timeout=30)
    back.put((type(obj).__name__, obj == Holder([cpu(6)])))


def test_another_process_gets_the_object_itself(installed):
    ctx = multiprocessing.get_context("fork")
    q, back = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_echo, args=(q, back))
    child.start()
    q.put(Holder([cpu(6)]))  # pickled here; the child unpickles it with pickle.loads
    assert back.get(timeout=30) == ("Holder", True)
    child.join(30)
    assert child.exitcode == 0


def test_past_the_bounds_is_pickled_in_the_caller(installed):
    q = multiprocessing.Queue()
    many = list(range(_ipc._MAX_ITEMS + 1)) + [cpu(9)]
    assert roundtrip(q, many) == many
    assert REDUCED == [(threading.current_thread().name, 9)]
    deep = cpu(4)
    for _ in range(_ipc._MAX_DEPTH + 1):
        deep = [deep]
    assert _ipc.may_hold_cuda(deep) and not _ipc.may_hold_cuda([[cpu()]])


def test_without_cuda_initialised_put_is_pytorch_s(installed):
    torch.cuda.initialized = False
    q = multiprocessing.Queue()
    assert roundtrip(q, Holder(1)) == Holder(1)
    assert Holder.reductions == ["QueueFeederThread"]


def test_another_pickling_error_is_left_to_the_feeder(installed):
    errors = []
    q = multiprocessing.Queue()
    original = multiprocessing.queues.Queue._on_queue_feeder_error
    multiprocessing.queues.Queue._on_queue_feeder_error = staticmethod(
        lambda e, obj: errors.append(type(e).__name__))
    try:
        q.put(Holder(lambda: 0))  # put() returns, as in PyTorch
        q.put("after")
        assert q.get(timeout=10) == "after"
    finally:
        multiprocessing.queues.Queue._on_queue_feeder_error = original
    assert errors, "the feeder did not see the error"


def test_a_queue_that_handles_feeder_errors_itself_is_left_alone(installed):
    seen = []

    class SafeQueue(multiprocessing.queues.Queue):  # as concurrent.futures' _SafeQueue
        def _on_queue_feeder_error(self, e, obj):
            seen.append(str(e))

    q = SafeQueue(ctx=multiprocessing.get_context())
    q.put(cuda())  # its put() runs where raising would break its owner
    q.put("after")
    assert q.get(timeout=10) == "after"
    assert seen and _ipc.REFUSAL in seen[0]


def test_pipe_and_simple_queue_raise_in_the_caller_without_cma(installed):
    _ipc.uninstall()
    a, b = multiprocessing.Pipe()
    with pytest.raises(RuntimeError, match="shareIpcHandle"):
        a.send((1, cuda()))
    with pytest.raises(RuntimeError, match="shareIpcHandle"):
        multiprocessing.SimpleQueue().put(cuda())


def test_uninstall_puts_pytorch_s_put_back():
    before = (multiprocessing.queues.Queue.put, multiprocessing.queues.JoinableQueue.put)
    _ipc.install()
    assert multiprocessing.queues.Queue.put is not before[0]
    assert multiprocessing.queues.JoinableQueue.put is not before[1]
    _ipc.install()  # once
    assert multiprocessing.queues.Queue.put._cma_wraps is before[0]
    _ipc.uninstall()
    assert (multiprocessing.queues.Queue.put, multiprocessing.queues.JoinableQueue.put) == before


if __name__ == "__main__":
    args = [__file__, "-q", "-p", "no:cacheprovider"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    sys.exit(pytest.main(args))
