"""What the staged step and the step during backward ask of an optimizer."""
import torch

# Only optimizers whose update of a parameter reads nothing but that
# parameter's gradient and state, exactly these classes.
ELEMENTWISE = tuple(getattr(torch.optim, n) for n in (
    "Adam", "AdamW", "SGD", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam")
    if hasattr(torch.optim, n))


def unhooked(step):
    """The optimizer class's step without torch.optim's hook wrapper (which
    the class's first instance installs), or None if it cannot be told."""
    while getattr(step, "hooked", False):
        step = getattr(step, "__wrapped__", None)
        if step is None:
            return None
    return step
