"""GPU route of the away state and the learned step (issue 48) and of
cma.torch.memory_summary (issue 50), each part in its own process (cma's
configuration is fixed per process):

  python3 away_route.py          # runs both parts, prints PASS/FAIL lines
  python3 away_route.py away     # send_away / bring_back / memory_summary
  python3 away_route.py learn    # a small training loop under learn_step:1
  python3 away_route.py plain    # the same loop without it (its losses must match)

Exit status 0 only if every check passed."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

MiB = 1 << 20
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + str(detail)), flush=True)
    return ok


def away_part():
    import cma.torch as cmat
    cmat.use_as_default()
    import torch
    x = torch.arange(16 * MiB, device="cuda", dtype=torch.float32)  # 64 MiB
    want = x.clone()
    torch.cuda.synchronize()
    before = cmat.memory_stats(0)
    cmat.send_away([x])
    after = cmat.memory_stats(0)
    ok = check("send_away drops reserved by the away bytes",
               after["away_bytes.all.current"] > 0 and
               after["reserved_bytes.all.current"] ==
               before["reserved_bytes.all.current"] - after["away_bytes.all.current"],
               (before["reserved_bytes.all.current"], after["reserved_bytes.all.current"],
                after["away_bytes.all.current"]))
    doubled = x * 2  # a kernel reads the away memory: pages migrate on demand
    ok &= check("a kernel reads away memory correctly", torch.equal(doubled, want * 2))
    x.add_(1)  # and writes it
    cmat.bring_back([x])
    torch.cuda.synchronize()
    ok &= check("bring_back restores the count", cmat.memory_stats(0)["away_bytes.all.current"] == 0)
    ok &= check("data kept through away, a write and back", torch.equal(x, want + 1))
    text = cmat.memory_summary()
    print(text)
    ok &= check("memory_summary names each place",
                all(w in text for w in ("Allocated", "Reserved on the device", "Away on the host",
                                        "Host tier", "nvidia-smi")))
    try:
        cmat.send_away([torch.empty(4, device="cpu")])
        ok &= check("a tensor cma does not own is refused", False, "no error")
    except Exception as e:  # noqa: BLE001 - any clear error
        ok &= check("a tensor cma does not own is refused", "cma" in str(e).lower(), e)
    return ok


def train_losses(torch):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(64, 2048, device="cuda")
    losses = []
    for _ in range(6):
        opt.zero_grad()
        loss = model(data).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print("LOSSES " + json.dumps(losses), flush=True)
    return losses


def plain_part():
    import cma.torch as cmat
    cmat.use_as_default()
    import torch
    train_losses(torch)
    return True


def learn_part():
    os.environ["CMA_ALLOC_CONF"] = "learn_step:1"
    import cma.torch as cmat
    cmat.use_as_default()
    import torch
    train_losses(torch)
    st = cmat.memory_stats(0)
    ok = check("the steps are learnt", st["learned_steps"] >= 5 and st["learned_plans"] >= 1,
               (st["learned_steps"], st["learned_plans"]))
    ok &= check("no divergence on a repeating step", st["learned_divergences"] == 0,
                st["learned_divergences"])
    return ok


def main():
    if len(sys.argv) > 1:
        return 0 if {"away": away_part, "learn": learn_part,
                     "plain": plain_part}[sys.argv[1]]() else 1
    rc = 0
    losses = {}
    for part in ("away", "learn", "plain"):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), part], timeout=300,
                           stdout=subprocess.PIPE, text=True)
        sys.stdout.write(r.stdout)
        rc |= r.returncode
        for line in r.stdout.splitlines():
            if line.startswith("LOSSES "):
                losses[part] = json.loads(line[len("LOSSES "):])
    if not check("learn_step's losses equal the plain loop's, bit for bit",
                 losses.get("learn") is not None and losses.get("learn") == losses.get("plain"),
                 losses):
        rc = 1
    print("away_route: " + ("PASS" if rc == 0 else "FAIL"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
