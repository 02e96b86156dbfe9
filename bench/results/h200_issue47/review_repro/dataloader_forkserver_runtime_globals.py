"""CPU switch + DataLoader: the new forkserver default re-imports the script in the
server, so Dataset code reading a module global that main() sets at run time
(argparse flags, a vocabulary, a normalisation constant) silently sees its
import-time value in the workers. Fork (plain PyTorch) sees main()'s value.
Compares the batches with the switch off (plain) and on."""
import _common  # noqa: F401
import torch
import cma.torch as cmat
from _common import finish

SCALE = 1.0   # set from the command line in main(), as scripts do


class Scaled(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor(float(i)) * SCALE


def batches():
    loader = torch.utils.data.DataLoader(Scaled(), batch_size=16, num_workers=2)
    return torch.cat(list(loader)), loader.multiprocessing_context


def main():
    global SCALE
    SCALE = 2.0
    cmat.use_as_default()
    plain, _ = batches()
    cmat.managed_cpu()
    try:
        got, ctx = batches()
    finally:
        cmat.managed_cpu(False)
    ok = torch.equal(plain, got)
    finish([("runtime_global_seen_by_workers", ok,
             f"context={ctx.get_start_method() if ctx else None}; plain sum "
             f"{plain.sum().item()}, switch on sum {got.sum().item()}")])


if __name__ == "__main__":
    main()
