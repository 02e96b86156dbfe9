"""Records the allocation trace of torch_train_bench.py's training loop under
PyTorch's native allocator, in the replay format of bench/traces/
(seq,action,addr,size,stream; free = free_completed), so the loop's requests
can be replayed by cma_bench on any backend, the host's included.

    python3 torch_record_trace.py --steps 60 --out bert_train.csv.gz
"""
import argparse
import gzip
import os

import torch_train_bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    torch.cuda.memory._record_memory_history(max_entries=4_000_000, stacks="python",
                                             context=None)
    torch_train_bench.train(a.steps, lambda: None)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    actions = {"alloc": "alloc", "free_completed": "free"}
    n = 0
    with gzip.open(a.out, "wt") as f:
        f.write("seq,action,addr,size,stream\n")
        for e in snapshot["device_traces"][0]:
            if e["action"] in actions:
                f.write("%d,%s,%d,%d,%d\n" % (n, actions[e["action"]], e["addr"], e["size"],
                                             e["stream"]))
                n += 1
    print("wrote %d events to %s" % (n, a.out))


if __name__ == "__main__":
    main()
