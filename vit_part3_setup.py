"""ViT, explained, Part 3: the setup numbers, offline.

Reproduces the article's arithmetic of Tables 1, 3 and 4: sequence lengths and forward compute of
every model/resolution, the parameter counts of the five released checkpoints, Batch Norm vs Group
Norm and Weight Standardization on a tiny batch, the ResNet-50 stages that can feed a hybrid, and
Adam, SGD with momentum, Polyak averaging and gradient clipping by hand against torch.

    python vit_part3_setup.py              # everything, offline, in seconds
    python vit_part3_setup.py --compare    # ... then this run's numbers beside the article's

Parameter counts come from the checkpoints' safetensors headers when the files are cached (or
reachable); otherwise from the Table 1 architecture built on the meta device. The ResNet-50 is
microsoft/resnet-50 when cached (or reachable), otherwise the library's architecture with random
weights: the shapes and the layer count do not depend on the weights.
"""
import math
import sys

import torch

from common import imagenette
from common.checkpoints import (
    cached_weight_file,
    hub_offline,
    load_pretrained,
    read_safetensors_header,
    remote_weight_header,
    split_parameter_count,
)
from common.cli import add_common_arguments, finish, guarded, run_sections, script_parser
from common.errors import UserError
from common.printing import header, line, number_list, short_list, subheader

# Table 1 of the paper: layers, hidden size D, MLP size, heads; and its parameter counts (millions).
VIT_SIZES = {"B": (12, 768, 3072, 12), "L": (24, 1024, 4096, 16), "H": (32, 1280, 5120, 16)}
TABLE1_MILLIONS = {"B": 86, "L": 307, "H": 632}
TABLE1_ROWS = [("B", 32), ("B", 16), ("L", 32), ("L", 16), ("H", 14)]
# The released checkpoints; ViT-L/16's only one is ImageNet fine-tuned, without a pre-logits layer.
RELEASED = [("B", 32, "google/vit-base-patch32-224-in21k", True),
            ("B", 16, "google/vit-base-patch16-224-in21k", True),
            ("L", 32, "google/vit-large-patch32-224-in21k", True),
            ("L", 16, "google/vit-large-patch16-224", False),
            ("H", 14, "google/vit-huge-patch14-224-in21k", True)]
# Table 3 (pre-training): epochs, training pictures, base LR, decay; batch 4096, 10k warm-up steps.
TABLE3 = [("pre-training ViT-B/16 on JFT-300M", 7, 303e6, 8e-4, "linear"),
          ("pre-training ViT-H/14 on JFT-300M", 14, 303e6, 3e-4, "linear"),
          ("pre-training ViT-B/16 on ImageNet-21k", 90, 14e6, 1e-3, "linear"),
          ("pre-training ViT on ImageNet", 300, 1.28e6, 3e-3, "cosine")]
PRETRAIN_BATCH, PRETRAIN_WARMUP = 4096, 10_000
# Table 4 (fine-tuning): steps at batch 512, and the standard training-set size of each task.
TABLE4 = [("ImageNet", 20_000, 1_280_000), ("CIFAR-100", 10_000, 50_000), ("CIFAR-10", 10_000, 50_000),
          ("Oxford-IIIT Pets", 500, 3_680), ("Oxford Flowers-102", 500, 2_040), ("VTAB task", 2_500, 1_000)]
FINETUNE_BATCH = 512


# ---------------------------------------------------------------- 1. Table 1 and parameters

def sequence_shape(resolution, patch):
    """grid side, N = (resolution/patch)^2 patches, sequence N+1, (N+1)^2 attention pairs per head."""
    grid = resolution // patch
    n = grid * grid
    return grid, n, n + 1, (n + 1) ** 2


def encoder_flops(layers, width, mlp, tokens):
    """Forward compute of a ViT encoder from its shapes, in FLOPs (a multiply-add counts as 2).

    Per layer, for a sequence of s tokens of width D and an MLP of width M:
      q, k, v and output projections  4 s D^2    multiply-adds
      MLP, two matrices               2 s D M
      scores Q K^T and weighted sum   2 s^2 D
    so FLOPs = 2 L (4 s D^2 + 2 s D M + 2 s^2 D). The patch embedding, norms, softmax and head are
    left out (under 1% of the total); this is the estimate the article prints.
    """
    s = tokens
    return 2 * layers * (4 * s * width**2 + 2 * s * width * mlp + 2 * s**2 * width)


def forward_gflops(size, patch, resolution):
    layers, width, mlp, _ = VIT_SIZES[size]
    return encoder_flops(layers, width, mlp, sequence_shape(resolution, patch)[2]) / 1e9


def table1_config(size, patch, image_size=224):
    from transformers import ViTConfig

    layers, width, mlp, heads = VIT_SIZES[size]
    return ViTConfig(hidden_size=width, num_hidden_layers=layers, intermediate_size=mlp,
                     num_attention_heads=heads, patch_size=patch, image_size=image_size)


def meta_parameter_shapes(config, pre_logits):
    """{name: shape} of a ViT built on the meta device (no memory, no weights), pooler if pre_logits."""
    from transformers import ViTModel

    with torch.device("meta"):
        model = ViTModel(config, add_pooling_layer=pre_logits)
    return {name: list(p.shape) for name, p in model.named_parameters()}


def checkpoint_shapes(name, size, patch, pre_logits):
    """({name: shape}, source): the cached weight file, else its header on the Hub, else meta."""
    path = cached_weight_file(name)
    if path:
        return read_safetensors_header(path), "weight file"
    shapes = remote_weight_header(name)
    if shapes:
        return shapes, "header from the Hub"
    return meta_parameter_shapes(table1_config(size, patch), pre_logits), "meta device"


def section_table1():
    header("1. Table 1 and the patch-size notation: ViT-<size>/<patch>")
    line("N = (resolution / patch)^2 patches, plus 1 [class] token; attention compares every pair: (N+1)^2 pairs per head")
    results = {}
    for size, patch in TABLE1_ROWS:
        for resolution in (224, 384):
            grid, n, seq, pairs = sequence_shape(resolution, patch)
            gflops = forward_gflops(size, patch, resolution)
            line(f"ViT-{size}/{patch} at {resolution}: grid {grid:>2}x{grid:<2} N = {n:>4}  sequence {seq:>4}  "
                 f"pairs per head {pairs:>9,}  forward compute about {gflops:6.1f} GFLOPs")
            key = f"ViT-{size}/{patch} at {resolution}"
            results.update({f"{key}: N": n, f"{key}: pairs": pairs, f"{key}: GFLOPs": gflops})
    n16, n32 = sequence_shape(224, 16)[1], sequence_shape(224, 32)[1]
    ratio = forward_gflops("B", 16, 224) / forward_gflops("B", 32, 224)
    line(f"ViT-B/16 vs ViT-B/32 at 224: {n16} vs {n32} patches = x{n16 // n32} "
         f"(patch side halved, so (1/2)^-2 = 4); compute x{ratio:.2f}")
    results["B/16 over B/32 compute at 224"] = ratio
    for size, patch, resolution in (("L", 16, 512), ("H", 14, 518)):
        grid, n, seq, _ = sequence_shape(resolution, patch)
        line(f"Table 2 fine-tuning resolution: ViT-{size}/{patch} at {resolution}: grid {grid}x{grid}, N = {n}, sequence {seq}")
        results[f"ViT-{size}/{patch} at {resolution}: sequence"] = seq
    return results


def section_parameters():
    counts, sources = {}, {}
    for size, patch, name, pre_logits in RELEASED:
        shapes, sources[size, patch] = checkpoint_shapes(name, size, patch, pre_logits)
        counts[size, patch] = split_parameter_count(shapes)
    if all(source == "weight file" for source in sources.values()):
        subheader("parameters of the released checkpoints, read from the weight files (no head, no pre-logits layer)")
    else:
        subheader("parameters of the released checkpoints (no head, no pre-logits layer); \"meta device\" = "
                  "counted from the Table 1 architecture, the weight file not being cached")
    results = {}
    for size, patch, name, _ in RELEASED:
        backbone, pre_logits = counts[size, patch]
        line(f"ViT-{size}/{patch} ({name.split('/')[-1]}, {sources[size, patch]}): backbone {backbone:>11,}  = "
             f"{backbone / 1e6:6.1f}M   pre-logits layer {pre_logits:>9,}   Table 1: {TABLE1_MILLIONS[size]}M")
        results.update({f"ViT-{size}/{patch} backbone": backbone, f"ViT-{size}/{patch} pre-logits": pre_logits})
    b32, b16 = counts["B", 32][0], counts["B", 16][0]
    width = VIT_SIZES["B"][1]
    # The two differ only in the patch embedding E (P*P*3 x D) and the position table ((N+1) x D).
    embedding_growth = (32 * 32 * 3 - 16 * 16 * 3) * width
    rows16, rows32 = sequence_shape(224, 16)[2], sequence_shape(224, 32)[2]
    position_shrink = (rows16 - rows32) * width
    line(f"ViT-B/32 minus ViT-B/16: {b32 - b16:,} parameters ({100 * (b32 - b16) / b16:.1f}% more), because E grows "
         f"from {16 * 16 * 3}x{width} to {32 * 32 * 3}x{width} (+{embedding_growth:,}) and the position table shrinks "
         f"from {rows16} to {rows32} rows (-{position_shrink:,})")
    l32 = sum(counts["L", 32])
    line(f"ViT-L/32 with its pre-logits layer: {l32 / 1e6:.1f}M; ViT-L/16 has {counts['L', 16][0] / 1e6:.1f}M without one")
    results.update({"B/32 minus B/16": b32 - b16, "B/32 over B/16 percent": 100 * (b32 - b16) / b16,
                    "ViT-L/32 with pre-logits (M)": l32 / 1e6})
    return results


# ---------------------------------------------------------------- 2. the hybrid

def resnet_stage_shapes(model, pixels):
    """(channels, height, width) of the four stage outputs of a transformers ResNet."""
    with torch.inference_mode():
        hidden = model(pixel_values=pixels, output_hidden_states=True).hidden_states
    return [tuple(h.shape[1:]) for h in hidden[1:]]  # hidden[0] is the stem's output


def load_resnet50():
    """(model, description): microsoft/resnet-50 if cached or reachable, else random weights."""
    from transformers import ResNetConfig, ResNetModel

    try:
        return load_pretrained(ResNetModel, "microsoft/resnet-50").eval(), "microsoft/resnet-50"
    except UserError:
        # ResNetConfig's defaults are ResNet-50: bottleneck blocks, depths 3-4-6-3, widths 256..2048.
        torch.manual_seed(0)
        why = "not cached" if hub_offline() else "neither cached nor reachable"
        return (ResNetModel(ResNetConfig()).eval(),
                f"the library's ResNet-50 architecture (random weights; microsoft/resnet-50 is {why})")


def hybrid_picture(resolution=224):
    """(pixels, description): the first Imagenette validation picture on disk, else a generated one."""
    import numpy as np
    from PIL import Image

    paths = sorted(imagenette.DEFAULT_DIR.glob("val/*/*.JPEG"))
    if paths:
        image, what = Image.open(paths[0]).convert("RGB"), str(paths[0])
    else:  # the stage shapes depend only on the picture's size
        noise = np.random.default_rng(0).integers(0, 256, size=(160, 213, 3), dtype=np.uint8)
        image, what = Image.fromarray(noise), "a generated 213x160 picture of noise (no Imagenette on disk)"
    image = image.resize((resolution, resolution), Image.BILINEAR)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])  # ImageNet statistics
    array = (np.asarray(image, dtype=np.float32) / 255 - mean) / std
    return torch.from_numpy(array.astype(np.float32)).permute(2, 0, 1)[None], what


def section_hybrid():
    header("2. the hybrid: which ResNet-50 stage feeds ViT")
    model, model_name = load_resnet50()
    pixels, picture = hybrid_picture()
    shapes = resnet_stage_shapes(model, pixels)
    results = {}
    for stage, (channels, height, width) in enumerate(shapes, 1):
        line(f"stage {stage} output: {channels:>4} channels x {height:>2} x {width:<2} -> as 1x1 patches: "
             f"{height * width:>5} tokens of {channels} numbers")
        results[f"stage {stage} tokens"] = height * width
    tokens4, tokens3 = shapes[3][1] * shapes[3][2], shapes[2][1] * shapes[2][2]
    line(f"option (i), stage 4: {tokens4} tokens; option (ii), extended stage 3: {tokens3} tokens "
         f"= x{tokens3 // tokens4} (the \"4x longer sequence\")")
    batch_norms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    line(f"{model_name} is a standard ResNet: it has {batch_norms} BatchNorm2d layers (BiT replaces each with Group Norm)")
    line(f"(picture: {picture}, resized to 224x224)")
    results["BatchNorm2d layers"] = batch_norms
    return results


# ---------------------------------------------------------------- 3. Batch Norm, Group Norm, WS

# Picture A and two partners: 4 channels of 2 pixels. The article gives A's channels 1 and 2; the
# partners' channel 1 is chosen to give its numbers: [9, 9] puts the batch mean at 5.5 and the std
# at sqrt(12.75), [-3, -5] puts them at -1 and sqrt(10). The other channels play no part in them.
PICTURE_A = [[1.0, 3.0], [2.0, 2.0], [0.0, 4.0], [1.0, 1.0]]
PARTNER_1 = [[9.0, 9.0], [4.0, 0.0], [2.0, 2.0], [1.0, 5.0]]
PARTNER_2 = [[-3.0, -5.0], [1.0, 1.0], [0.0, 6.0], [3.0, 3.0]]
FILTER_1, FILTER_2 = [0.2, -0.1, 0.5, 0.0], [1.0, 2.0, 3.0, 2.0]
NORM_EPS = 1e-5  # torch's default for BatchNorm2d and GroupNorm


def batch_norm(batch, eps=NORM_EPS):
    """x (pictures, channels, pixels): each channel uses the mean and variance over pictures and pixels."""
    mean = batch.mean(dim=(0, 2), keepdim=True)
    var = batch.var(dim=(0, 2), unbiased=False, keepdim=True)
    return (batch - mean) / torch.sqrt(var + eps)


def group_norm(batch, groups, eps=NORM_EPS):
    """Each picture alone: the mean and variance over the channels of a group and their pixels."""
    pictures, channels, pixels = batch.shape
    grouped = batch.reshape(pictures, groups, channels // groups * pixels)
    mean = grouped.mean(dim=2, keepdim=True)
    var = grouped.var(dim=2, unbiased=False, keepdim=True)
    return ((grouped - mean) / torch.sqrt(var + eps)).reshape(pictures, channels, pixels)


def weight_standardize(weights, eps=0.0):
    """w_hat = (w - mean(w)) / std(w) over each filter (the last dimension)."""
    mean = weights.mean(dim=-1, keepdim=True)
    return (weights - mean) / torch.sqrt(weights.var(dim=-1, unbiased=False, keepdim=True) + eps)


def section_norms():
    header("3. Batch Norm vs Group Norm on a tiny batch (4 channels, 2 pixels per channel, 2 groups)")
    a = torch.tensor(PICTURE_A, dtype=torch.float64)
    line(f"picture A, channel 1 = {short_list(a[0])}")
    results = {}
    torch_bn_agrees = torch_gn_agrees = True
    for i, partner in enumerate((PARTNER_1, PARTNER_2), 1):
        batch = torch.stack([a, torch.tensor(partner, dtype=torch.float64)])
        by_hand = batch_norm(batch)
        note = "   (same picture, different output)" if i == 2 else ""
        line(f"Batch Norm, A batched with partner {i}: A channel 1 -> {number_list(by_hand[0, 0], '6.3f')}{note}")
        results[f"BN partner {i} pixel 1"], results[f"BN partner {i} pixel 2"] = by_hand[0, 0].tolist()
        torch_bn = torch.nn.BatchNorm1d(4, affine=False, eps=NORM_EPS, dtype=torch.float64).train()(batch)
        torch_gn = torch.nn.GroupNorm(2, 4, affine=False, eps=NORM_EPS, dtype=torch.float64)(batch)
        torch_bn_agrees &= torch.allclose(torch_bn, by_hand, atol=1e-12)
        torch_gn_agrees &= torch.allclose(torch_gn, group_norm(batch, 2), atol=1e-12)
    group = a[:2].flatten()
    line(f"Group Norm, group 1 = channels 1 and 2 of A = {short_list(group)}: mean {group.mean():.3f}, "
         f"std {group.std(unbiased=False):.3f}")
    a_gn = group_norm(a[None], 2)[0]
    line(f"Group Norm: A channel 1 -> {number_list(a_gn[0], '6.3f')} with any partner (it never looks at the batch); "
         f"torch GroupNorm agrees: {torch_gn_agrees}")
    line(f"torch BatchNorm (training mode, batch statistics) agrees with both Batch Norm lines: {torch_bn_agrees}")
    results.update({"GN group 1 std": group.std(unbiased=False).item(), "GN pixel 1": a_gn[0, 0].item(),
                    "GN pixel 2": a_gn[0, 1].item()})
    filters = torch.tensor([FILTER_1, FILTER_2], dtype=torch.float64)
    standardized = weight_standardize(filters)
    f2 = filters[1]
    line(f"Weight Standardization: filter 2 = {short_list(f2)}: mean {f2.mean():.2f}, std {f2.std(unbiased=False):.4f} "
         f"-> {number_list(standardized[1], '6.3f')}")
    line(f"filter 1 = {short_list(filters[0])} -> {number_list(standardized[0], '6.3f')}   "
         f"(every filter now has mean 0 and std 1 before the convolution uses it)")
    results.update({f"WS filter 1 value {i + 1}": v for i, v in enumerate(standardized[0].tolist())})
    results["WS filter 2 std"] = f2.std(unbiased=False).item()
    if not (torch_bn_agrees and torch_gn_agrees):
        raise RuntimeError("torch's BatchNorm/GroupNorm disagree with the by-hand formulas")
    return results


# ---------------------------------------------------------------- 4. optimizers and schedules

GRADIENTS = [0.5, -0.1, 0.3]  # the three gradients of the Adam and SGD examples, from w = 1


def adam_by_hand(gradients, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, w=1.0):
    """One row (t, g, m, v, m_hat, v_hat, step, w) per step of Adam on a single weight.

    m_t = b1 m + (1 - b1) g,  v_t = b2 v + (1 - b2) g^2,  m_hat = m_t / (1 - b1^t),
    v_hat = v_t / (1 - b2^t),  w <- w - lr m_hat / (sqrt(v_hat) + eps).
    """
    m = v = 0.0
    rows = []
    for t, g in enumerate(gradients, 1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
        step = lr * m_hat / (math.sqrt(v_hat) + eps)
        w -= step
        rows.append((t, g, m, v, m_hat, v_hat, step, w))
    return rows


def sgd_momentum_by_hand(gradients, lr=0.01, momentum=0.9, w=1.0):
    """Rows (t, g, velocity, w): u_t = mu u + g, w <- w - lr u_t (torch's convention, no dampening)."""
    velocity = 0.0
    rows = []
    for t, g in enumerate(gradients, 1):
        velocity = momentum * velocity + g
        w -= lr * velocity
        rows.append((t, g, velocity, w))
    return rows


def polyak_average(weights, factor):
    """w_bar_1 = w_1, then w_bar_t = factor w_bar + (1 - factor) w_t."""
    averages = [weights[0]]
    for w in weights[1:]:
        averages.append(factor * averages[-1] + (1 - factor) * w)
    return averages


def clip_by_global_norm(gradients, max_norm):
    """Multiply every gradient by min(1, max_norm / ||g||), ||g|| = sqrt(sum of all g_i^2)."""
    norm = math.sqrt(sum(g * g for tensor in gradients for g in tensor))
    scale = min(1.0, max_norm / norm)
    return norm, [[g * scale for g in tensor] for tensor in gradients]


def pretraining_steps(epochs, pictures, batch=PRETRAIN_BATCH):
    return round(epochs * pictures / batch)


def warmup_linear_lr(step, base_lr, total_steps, warmup=PRETRAIN_WARMUP):
    """Linear warm-up from 0 to base_lr over `warmup` steps, then linear decay to 0 at total_steps."""
    if step < warmup:
        return base_lr * step / warmup
    return base_lr * (total_steps - step) / (total_steps - warmup)


def cosine_lr(step, base_lr, total_steps):
    """eta_t = eta_0 / 2 (1 + cos(pi t / T))."""
    return base_lr / 2 * (1 + math.cos(math.pi * step / total_steps))


def torch_optimizer_weight(optimizer_class, gradients, **settings):
    """w after torch's optimizer takes the given gradients, from w = 1 (float64)."""
    w = torch.nn.Parameter(torch.tensor(1.0, dtype=torch.float64))
    optimizer = optimizer_class([w], **settings)
    for g in gradients:
        w.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
    return w.item()


def torch_adam(gradients, lr=1e-3):
    return torch_optimizer_weight(torch.optim.Adam, gradients, lr=lr)


def torch_sgd(gradients, lr=0.01, momentum=0.9):
    return torch_optimizer_weight(torch.optim.SGD, gradients, lr=lr, momentum=momentum)


def torch_clip(gradients, max_norm):
    params = [torch.nn.Parameter(torch.zeros(len(g), dtype=torch.float64)) for g in gradients]
    for p, g in zip(params, gradients):
        p.grad = torch.tensor(g, dtype=torch.float64)
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    return [p.grad.tolist() for p in params]


def section_optimizers():
    header("4. pre-training and fine-tuning by hand: Adam, Table 3, SGD with momentum, Polyak averaging, "
           "clipping, Table 4")
    results = {}
    adam = adam_by_hand(GRADIENTS)
    for t, g, m, v, m_hat, v_hat, step, w in adam:
        line(f"Adam t={t}: g={g:5.2f}  m={m:.4f}  v={v:.6f}  m_hat={m_hat:.4f}  v_hat={v_hat:.4f}  "
             f"step = lr*m_hat/sqrt(v_hat) = {step:.6f}  w={w:.6f}")
        results.update({f"Adam t={t} step": step, f"Adam t={t} w": w})
    torch_w = torch_adam(GRADIENTS)
    line(f"torch.optim.Adam after the same three gradients: w={torch_w:.6f}  (ours {adam[-1][-1]:.6f})")
    results["torch Adam w"] = torch_w
    print()
    for label, epochs, pictures, base_lr, decay in TABLE3:
        steps = pretraining_steps(epochs, pictures)
        line(f"{label:<39}: {epochs:>3} epochs x {pictures / 1e6:6.2f}M images / batch {PRETRAIN_BATCH} = "
             f"{steps:>9,} steps; warm-up {PRETRAIN_WARMUP:,} = {100 * PRETRAIN_WARMUP / steps:4.1f}% of them; "
             f"base LR {base_lr:g}, {decay} decay")
        results.update({f"{label}: steps": steps, f"{label}: warm-up %": 100 * PRETRAIN_WARMUP / steps})
    total = pretraining_steps(7, 303e6)
    middle = PRETRAIN_WARMUP + (total - PRETRAIN_WARMUP) // 2
    lrs = [warmup_linear_lr(s, 8e-4, total) for s in (5_000, 10_000, middle)]
    line(f"ViT-B/16 on JFT: LR at step 5,000 = {lrs[0]:.1e} (half way up the warm-up), at 10,000 = {lrs[1]:.1e}, "
         f"at the middle of the decay = {lrs[2]:.1e}")
    results.update({"JFT LR at 5,000": lrs[0], "JFT LR at 10,000": lrs[1], "JFT LR at mid-decay": lrs[2]})
    print()
    sgd = sgd_momentum_by_hand(GRADIENTS)
    for t, g, velocity, w in sgd:
        line(f"SGD momentum 0.9, lr 0.01, t={t}: g={g:5.2f}  velocity = 0.9*velocity + g = {velocity:.4f}  "
             f"w = w - lr*velocity = {w:.5f}")
        results.update({f"SGD t={t} velocity": velocity, f"SGD t={t} w": w})
    torch_w = torch_sgd(GRADIENTS)
    line(f"torch.optim.SGD(momentum=0.9) after the same gradients: w={torch_w:.5f}  (ours {sgd[-1][-1]:.5f})")
    results["torch SGD w"] = torch_w
    weights = [1.0, 1.2, 0.9, 1.1, 1.05]
    averages = polyak_average(weights, 0.9)
    line(f"Polyak (exponential) averaging, factor 0.9: weights {short_list(weights)} -> averages {short_list(averages)}")
    results.update({f"Polyak average {i + 1}": a for i, a in enumerate(averages)})
    memory = 1 / (1 - 0.9999)
    line(f"a factor of 0.9999 averages over roughly the last 1/(1 - 0.9999) = {memory:,.0f} steps")
    results["Polyak 0.9999 memory"] = memory
    print()
    gradients = [[3.0, 0.0], [4.0]]
    norm, clipped = clip_by_global_norm(gradients, 1.0)
    line(f"clipping at global norm 1: gradients of two tensors [3, 0] and [4]; global norm sqrt(9 + 0 + 16) = {norm:.1f} "
         f"> 1, so every gradient is multiplied by 1/{norm:g}: {short_list(clipped[0])} and {short_list(clipped[1])}; "
         f"direction kept, length 1")
    by_torch = torch_clip(gradients, 1.0)
    line(f"torch.nn.utils.clip_grad_norm_: {short_list(by_torch[0])} and {short_list(by_torch[1])}")
    results.update({"clip global norm": norm, "clipped 3": clipped[0][0], "clipped 4": clipped[1][0],
                    "torch clipped 3": by_torch[0][0], "torch clipped 4": by_torch[1][0]})
    print()
    for task, steps, pictures in TABLE4:
        seen = steps * FINETUNE_BATCH
        line(f"{'fine-tuning ' + task:<31}: {steps:>6,} steps x batch {FINETUNE_BATCH} = {seen / 1e6:6.2f}M pictures seen "
             f"= {seen / pictures:7.1f} passes over {pictures:,} training pictures")
        results.update({f"{task}: pictures seen (M)": seen / 1e6, f"{task}: passes": seen / pictures})
    cosine = {s: cosine_lr(s, 0.03, 20_000) for s in (0, 10_000, 15_000, 20_000)}
    line("ImageNet fine-tuning at base LR 0.03, cosine: "
         + ", ".join(f"step {s:,} -> {lr:.2g}" for s, lr in cosine.items()))
    results.update({f"cosine LR at {s:,}": lr for s, lr in cosine.items()})
    return results


def main(argv=None):
    parser = script_parser(__doc__)
    add_common_arguments(parser, device=False)
    args = parser.parse_args(argv)
    torch.set_num_threads(min(4, torch.get_num_threads()))
    results, problems = run_sections([section_table1, section_parameters, section_hybrid, section_norms,
                                      section_optimizers])
    return finish("setup", args, results, problems)


if __name__ == "__main__":
    sys.exit(guarded(main))
