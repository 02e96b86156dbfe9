"""cma.torch's training helpers for oversubscription: the global optimizer
hooks and host_resident() (plan.py), the staged optimizer step
(staged_step.py), the activation offload (offload.py) and the step during
backward (step_in_backward.py). cma.torch re-exports what users call."""
