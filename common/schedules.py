"""Learning-rate schedules: pre-training's warm-up + linear decay, cosine decay, fine-tuning's warm-up + cosine."""
import math


def warmup_linear_lr(step, base_lr, total_steps, warmup):
    """Linear warm-up from 0 to base_lr over `warmup` steps, then linear decay to 0 at total_steps."""
    if step < warmup:
        return base_lr * step / warmup
    return base_lr * (total_steps - step) / (total_steps - warmup)


def cosine_lr(step, base_lr, total_steps):
    """eta_t = eta_0 / 2 (1 + cos(pi t / T))."""
    return base_lr / 2 * (1 + math.cos(math.pi * step / total_steps))


def warmup_cosine_lr(step, base_lr, total_steps, warmup):
    """The LR after `step` finished steps: eta_0 t / W while t < W, then eta_0 / 2 (1 + cos(pi (t - W) / (T - W)))."""
    if step < warmup:
        return base_lr * step / warmup
    return cosine_lr(step - warmup, base_lr, total_steps - warmup)
