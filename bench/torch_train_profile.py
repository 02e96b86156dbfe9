"""Profiles a few steps of torch_train_bench.py's loop under one route and
prints where host and device time went (torch.profiler), to explain a step
time gap between routes.

    python3 torch_train_profile.py --route cma --steps 12 > profile_cma.txt
"""
import argparse
import os

import torch_train_bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--route", default="cma", choices=("native", "cma"))
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    if a.route == "cma":
        import cma.torch as cmat
        cmat.use_as_default()
    from torch.profiler import ProfilerActivity, profile, schedule
    sched = schedule(wait=0, warmup=a.steps - 4, active=4)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=sched) as prof:
        _, times = torch_train_bench.train(a.steps, prof.step)
    print("step ms:", ["%.1f" % t for t in times])
    table = prof.key_averages()
    print(table.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=50))
    print(table.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=50))


if __name__ == "__main__":
    main()
