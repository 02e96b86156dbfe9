"""Oversubscription's training path in one process, for torch_gpu_test.py.
Nothing is oversubscribed: with CMA_OPTIMIZER_STATE=host, `oversubscribe:1`
lets the optimizer's state live on the host (routed there by cma.torch's
optimizer hooks), which is all the staged step
(cma/torch/training/staged_step.py) needs.

    python3 oversub_route.py native|staged|direct|offload|fit|partial fused|foreach|single  ->  JSON
fit: the default placement, the state kept on the device as far as it fits
(all of it here);
partial: the same with the device's part set, before the second step's
update (the one whose peak decides), to the peak so far plus half the state
(and the margin and a foreach update's temporaries kept), so that part of the state stays on the device and
the rest on the host;
staged: 4 MiB chunks, so the two buffers alternate many times a step;
direct: CMA_STAGED_STEP=0 (the state read in place over the link);
offload: CMA_ACTIVATION_OFFLOAD=64 (64 MiB of saved activations a step
travel to the host and back);
inbwd: cma.torch.step_in_backward(opt, bucket_mib=8) (each bucket updated
during backward), and inbwd_native the same hint over PyTorch's own
allocator; both also check that misuse is refused.
Every route must give the same losses, parameters and optimizer state."""
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
route, impl = sys.argv[1], sys.argv[2]
if route == "direct":
    os.environ["CMA_STAGED_STEP"] = "0"
elif route == "staged":
    os.environ["CMA_STAGED_STEP"] = "4"
elif route == "offload":
    os.environ["CMA_ACTIVATION_OFFLOAD"] = "64"
if route in ("staged", "direct", "offload", "inbwd"):
    os.environ["CMA_OPTIMIZER_STATE"] = "host"
elif route == "partial":
    # Staging host state takes two chunk buffers during the step that
    # measures: room the kept state then leaves (not what this route checks).
    os.environ["CMA_STAGED_STEP"] = "0"

import torch  # noqa: E402
import cma.torch as cmat  # noqa: E402
from cma import _lib as cma_lib  # noqa: E402

if route not in ("native", "inbwd_native"):
    cmat.use_as_default("oversubscribe:1")
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


width, depth = 1024, 6
layers = []
for _ in range(depth):
    layers += [torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)]
model = torch.nn.Sequential(torch.nn.Embedding(4096, width), *layers,
                            torch.nn.Linear(width, 4096)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01,
                        **{"fused": {"fused": True}, "foreach": {"foreach": True},
                           "single": {"foreach": False}}[impl])
if route.startswith("inbwd"):
    cmat.step_in_backward(opt, bucket_mib=8)
seen_grads = []
# A post-hook the caller registered before the first step sees the gradients.
opt.register_step_post_hook(lambda o, a, k: seen_grads.append(
    all(p.grad is not None for g in o.param_groups for p in g["params"])))
g = torch.Generator(device="cuda").manual_seed(1)
losses = []
for step in range(8):
    x = torch.randint(0, 4096, (8, 128), device="cuda", generator=g)
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if route == "partial" and step == 1:
        from cma.torch.training import plan
        peak = cma_lib.stats(0)["peak_live_device_bytes"]
        half = sum(p.numel() * p.element_size() for p in model.parameters())  # AdamW: 2x params
        # (A foreach update's temporaries, about the parameters' size, get room too.)
        extra = sum(plan._foreach_temporaries(opt).values())
        budget = (peak + plan._STATE_MARGIN_BYTES + half + extra) * plan._MARGIN_SHARE // (
            plan._MARGIN_SHARE - 1)
        torch.cuda.set_per_process_memory_fraction(
            budget / torch.cuda.get_device_properties(0).total_memory)
    opt.step()
    if step == 0 and route not in ("native", "inbwd_native"):
        # Where the first step made the state (fit keeps it from the second).
        first_state = [t for p in model.parameters() for t in opt.state[p].values()
                       if torch.is_tensor(t) and t.is_cuda]
        state_on_host_after_first = sum(t.numel() * t.element_size() for t in first_state
                                        if cma_lib.placed_on_host(t.data_ptr()))
    losses.append(loss.item())
torch.cuda.synchronize()
state = [t for p in model.parameters() for t in opt.state[p].values() if torch.is_tensor(t)]
out = {"route": route, "impl": impl, "losses": losses,
       "params": digest(model.parameters()), "state": digest(state),
       "post_hook_saw_grads": all(seen_grads)}
if route.startswith("inbwd"):
    from cma.torch.training import step_in_backward as sib
    out["buckets_applied"] = sib.buckets_applied(opt)
    out["grads_after_backward"] = sum(p.grad is not None for p in model.parameters())
    out["side_stream_sms"] = {str(k): v for k, v in sib.side_stream_sms(opt).items()}
    out["tail_state_bytes"] = sib.tail_state_bytes(opt)
    refused = {}
    x = torch.randint(0, 4096, (8, 128), device="cuda", generator=g)
    # Clipping after the update: refused, naming the hint.
    model(x).float().mean().backward()
    try:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        refused["clip"] = False
    except RuntimeError as e:
        refused["clip"] = "step_in_backward" in str(e)
    # A second backward before optimizer.step(): refused.
    try:
        model(x).float().mean().backward()
        refused["accumulate"] = False
    except RuntimeError as e:
        refused["accumulate"] = "second backward" in str(e)
    opt.step()
    # GradScaler while the hint is attached: refused before anything runs.
    try:
        torch.amp.GradScaler("cuda").scale(model(x).float().mean())
        refused["scaler"] = False
    except RuntimeError as e:
        refused["scaler"] = "step_in_backward" in str(e)
    for bad, exc in ((lambda: cmat.step_in_backward(object()), TypeError),
                     (lambda: cmat.step_in_backward(torch.optim.LBFGS(model.parameters())),
                      ValueError),
                     (lambda: cmat.step_in_backward(
                         torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))])), ValueError),
                     # a second live optimizer over the same parameters
                     (lambda: cmat.step_in_backward(torch.optim.AdamW(model.parameters())),
                      ValueError)):
        try:
            bad()
            refused.setdefault("bad_input", []).append(False)
        except exc:
            refused.setdefault("bad_input", []).append(True)
    out["refused"] = refused
if route not in ("native", "inbwd_native"):
    from cma.torch.training import staged_step as torch_staged_step
    st = cmat.memory_stats()
    out["steps_staged"] = torch_staged_step.steps_staged(opt)
    from cma.torch.training import offload as torch_offload
    out["offload"] = torch_offload.stats(0)
    out["num_host_placements"] = st.get("num_host_placements", 0)
    out["state_on_host"] = sum(cma_lib.placed_on_host(t.data_ptr()) for t in state
                               if t.numel() * t.element_size() >= (1 << 20))
    out["state_large"] = sum(t.numel() * t.element_size() >= (1 << 20) for t in state)
    on_gpu = [t for t in state if t.is_cuda]  # (a foreach step's counters stay on the CPU)
    out["state_bytes_on_host"] = sum(t.numel() * t.element_size() for t in on_gpu
                                     if cma_lib.placed_on_host(t.data_ptr()))
    out["state_bytes"] = sum(t.numel() * t.element_size() for t in on_gpu)
    out["state_bytes_on_host_after_first"] = state_on_host_after_first
    # A hint naming a tensor cma does not own: ValueError, nothing changed.
    cpu_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))])
    try:
        cmat.host_resident(cpu_opt)
        out["host_resident_refuses_cpu"] = False
    except ValueError as e:
        out["host_resident_refuses_cpu"] = "not a CUDA tensor cma owns" in str(e)
print(json.dumps(out))
