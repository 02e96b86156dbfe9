"""A DataLoader with default arguments under cma's CPU switch (issue 50):
a Dataset made of tensors created after managed_cpu(), read by 2 and 8
workers with no start method chosen; their batches come pinned. Forked workers cannot read managed
memory (they died with SIGSEGV); the switch now starts them with
forkserver. The script is deliberately unguarded at module level, as users
write it: forkserver's server imports it as __mp_main__, where the switch
must stay off, or the module-level table below would be managed there and
the workers forked from the server would die the same way.

    python3 dataloader_route.py   ->  one JSON line; exit 1 if a check failed
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import cma  # noqa: E402
import cma.torch as cmat  # noqa: E402

cmat.use_as_default()
SWITCH_AT_IMPORT = cmat.managed_cpu()  # unguarded: also runs in forkserver's server
SWITCH_ON_HERE = cmat.is_managed_cpu()
TABLE = torch.arange(1024, dtype=torch.float32)  # read by workers through a global


class Offsets(torch.utils.data.Dataset):
    """Reads the module-level TABLE in the worker: the server's copy."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        return TABLE[i % 1024] + i


def worker_reports(_):
    info = torch.utils.data.get_worker_info()
    # In a worker the switch must be off and turning it on must do nothing.
    assert not cmat.is_managed_cpu(), "the switch is on in a DataLoader worker"
    assert cmat.managed_cpu() is False and not cmat.is_managed_cpu(), info


def main():
    out = {"switch_on_in_main": SWITCH_ON_HERE}
    n = 4096
    features = torch.randn(n, 256)
    labels = torch.arange(n)
    out["dataset_is_managed"] = cma._lib.allocation_size(features.data_ptr()) is not None
    dataset = torch.utils.data.TensorDataset(features, labels)
    want = features.double().sum().item()
    for workers in (2, 8):
        loader = torch.utils.data.DataLoader(dataset, batch_size=128, num_workers=workers,
                                             worker_init_fn=worker_reports)
        start = time.perf_counter()
        got, seen = 0.0, 0
        for x, y in loader:
            got += x.to("cuda").double().sum().item()
            seen += y.numel()
        out[f"workers_{workers}"] = {
            "context": loader.multiprocessing_context.get_start_method(),
            "pinned": loader.pin_memory and x.is_pinned(),
            "ok": seen == n and abs(got - want) < 1e-6 * max(1.0, abs(want)),
            "seconds": round(time.perf_counter() - start, 3)}
    # A global read by workers: the server's copy, made with the switch off.
    offsets = torch.utils.data.DataLoader(Offsets(), batch_size=32, num_workers=2)
    out["module_level_table_read"] = sum(b.sum().item() for b in offsets) == float(
        sum((i % 1024) + i for i in range(256)))
    # An explicit choice is respected, and the switch off changes nothing.
    forked = torch.utils.data.DataLoader(dataset, num_workers=2, multiprocessing_context="fork")
    out["explicit_fork_kept"] = forked.multiprocessing_context.get_start_method() == "fork"
    cmat.managed_cpu(False)
    plain = torch.utils.data.DataLoader(dataset, num_workers=2)
    out["switch_off_leaves_default"] = plain.multiprocessing_context is None
    cmat.managed_cpu()
    os.environ["CMA_DATALOADER_START"] = "fork"
    opted = torch.utils.data.DataLoader(dataset, num_workers=2)
    out["opt_out_keeps_default"] = opted.multiprocessing_context is None
    os.environ["CMA_DATALOADER_START"] = "sometimes"
    try:
        torch.utils.data.DataLoader(dataset, num_workers=2)
        out["bad_opt_out_refused"] = False
    except ValueError as e:
        out["bad_opt_out_refused"] = "CMA_DATALOADER_START" in str(e)
    del os.environ["CMA_DATALOADER_START"]
    # Batches are pinned unless the caller chose, or opted out.
    chosen = torch.utils.data.DataLoader(dataset, num_workers=2, pin_memory=False)
    os.environ["CMA_DATALOADER_PIN"] = "0"
    unpinned = torch.utils.data.DataLoader(dataset, num_workers=2)
    del os.environ["CMA_DATALOADER_PIN"]
    out["pin_choice_kept"] = not chosen.pin_memory and not unpinned.pin_memory
    checks = [out["workers_2"]["pinned"], out["workers_8"]["pinned"], out["pin_choice_kept"],out["switch_on_in_main"], out["dataset_is_managed"], out["workers_2"]["ok"],
              out["workers_8"]["ok"], out["workers_2"]["context"] == "forkserver",
              out["module_level_table_read"], out["explicit_fork_kept"],
              out["switch_off_leaves_default"], out["opt_out_keeps_default"],
              out["bad_opt_out_refused"]]
    out["passed"] = all(checks)
    print(json.dumps(out))
    sys.exit(0 if out["passed"] else 1)


if __name__ == "__main__":
    main()
