"""CPU switch + DataLoader: forkserver (the new default under managed_cpu()) pickles
the Dataset; torch's reducer moves each CPU tensor into shared memory by swapping
the storage's data pointer in place (StorageSharing.cpp _share_fd_cpu_), which
frees the old cma allocation. A zero-copy alias made earlier (X.cuda()/X.to()) still
points at it: its data is then whatever the host pool puts there next. With fork
(or no cma) nothing is pickled and the alias stays valid."""
import _common  # noqa: F401
import torch
import cma.torch as cmat
from _common import finish


def main():
    cmat.use_as_default()
    cmat.managed_cpu()
    try:
        n = 1 << 20
        X = torch.arange(n, dtype=torch.float32)               # managed (switch on)
        Y = torch.zeros(n)
        Xg = X.cuda()                                           # zero-copy alias
        alias = Xg.data_ptr() == X.data_ptr()
        want = torch.arange(n, dtype=torch.float32, device="cuda")
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y),
                                             batch_size=4096, num_workers=1)
        ctx = loader.multiprocessing_context
        next(iter(loader))                                      # workers start: Dataset pickled
        moved = X.data_ptr() != Xg.data_ptr()
        junk = [torch.full((n,), -7.0) for _ in range(8)]       # the host pool reuses memory
        for j in junk:
            j.add_(0)
        torch.cuda.synchronize()
        ok = torch.equal(Xg, want)
        finish([("alias_survives_worker_start", ok and not moved,
                 f"alias={alias}, context={ctx.get_start_method() if ctx else None}, "
                 f"source storage moved={moved}, alias intact={ok}")])
    finally:
        cmat.managed_cpu(False)


if __name__ == "__main__":
    main()
