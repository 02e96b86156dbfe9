"""FSDP2 (fully_shard) in a one-rank process group, for torch_gpu_test.py:
its parameters and optimizer state are DTensors, which cma.torch's
training paths read through their local shards.

    python3 fsdp_route.py native|cma|oversub fused|foreach  ->  JSON
native: PyTorch's allocator; cma: cma as the default allocator; oversub:
cma with `oversubscribe:1` and CMA_OPTIMIZER_STATE=host (the optimizer's
state made on the host, cma.torch's optimizer hooks and activation offload
watching the sharded parameters). Every route must give the same losses."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
route, impl = sys.argv[1], sys.argv[2]
if route == "oversub":
    os.environ["CMA_OPTIMIZER_STATE"] = "host"
os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import cma.torch as cmat  # noqa: E402
from cma.torch import _placement  # noqa: E402

if route == "cma":
    cmat.use_as_default()
elif route == "oversub":
    cmat.use_as_default("oversubscribe:1")
from torch.distributed.fsdp import fully_shard  # noqa: E402

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                                  torch.nn.Linear(2048, 512))
                              for _ in range(4)]).cuda()
for block in model:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **{impl: True})
data = torch.randn(8, 128, 512, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
losses = []
for _ in range(6):
    loss = model(data).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(float(loss).hex())
state = [t for s in opt.state.values() for t in s.values()
         if torch.is_tensor(t) and t.is_cuda and t.numel() > 1]
out = {"route": route, "impl": impl, "losses": losses,
       "params_are_dtensors": all(type(p).__name__ == "DTensor" for p in model.parameters()),
       "state_tensors": len(state),
       "state_on_host": sum(_placement.on_host(_placement.local(t)) for t in state)}
dist.destroy_process_group()
print(json.dumps(out))
