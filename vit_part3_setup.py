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
from common.cli import add_common_arguments, script_parser
from common.compute import (
    VIT_SIZES,
    attention_flops,
    forward_gflops,
    patch_embedding_flops,
    sequence_shape,
    table1_config,
    token_flops,
)
from common.errors import UserError
from common.run import Run, guarded, run_sections
from common.schedules import cosine_lr, warmup_linear_lr

# Table 1's parameter counts (millions), its rows, and the released checkpoints; ViT-L/16's only one
# is ImageNet fine-tuned, without a pre-logits layer.
TABLE1_MILLIONS = {"B": 86, "L": 307, "H": 632}
TABLE1_ROWS = [("B", 32), ("B", 16), ("L", 32), ("L", 16), ("H", 14)]
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

def section_table1(run, report):
    """1. Table 1: sequence, attention pairs and forward compute"""
    report.header("1. Table 1 and the patch-size notation: ViT-<size>/<patch>")
    report.line("N = (resolution / patch)^2 patches, plus 1 [class] token; attention compares every pair: "
                "(N+1)^2 pairs per head")
    n = report.num
    for size, patch in TABLE1_ROWS:
        for resolution in (224, 384):
            grid, patches, seq, pairs = sequence_shape(resolution, patch)
            key = f"ViT-{size}/{patch} at {resolution}"
            gflops = forward_gflops(size, patch, resolution)
            report.line(f"{key}: grid {n(f'{key}: grid', grid, '>2')}x{grid:<2} N = {n(f'{key}: N', patches, '>4')}  "
                        f"sequence {n(f'{key}: sequence', seq, '>4')}  pairs per head "
                        f"{n(f'{key}: pairs', pairs, '>9,')}  forward compute about "
                        f"{n(f'{key}: GFLOPs', gflops, '6.1f')} GFLOPs")
    n16, n32 = sequence_shape(224, 16)[1], sequence_shape(224, 32)[1]
    ratio = forward_gflops("B", 16, 224) / forward_gflops("B", 32, 224)
    report.line(f"ViT-B/16 vs ViT-B/32 at 224: {n('B/16 patches at 224', n16)} vs {n('B/32 patches at 224', n32)} "
                f"patches = x{n('B/16 over B/32 patches', n16 // n32)} (patch side halved, so (1/2)^-2 = 4); compute "
                f"x{n('B/16 over B/32 compute at 224', ratio, '.2f')}")
    report_where_the_ratio_comes_from(report)
    for size, patch, resolution in (("L", 16, 512), ("H", 14, 518)):
        grid, patches, seq, _ = sequence_shape(resolution, patch)
        key = f"ViT-{size}/{patch} at {resolution}"
        report.line(f"Table 2 fine-tuning resolution: {key}: grid {n(f'{key}: grid', grid)}x{grid}, "
                    f"N = {n(f'{key}: N', patches)}, sequence {n(f'{key}: sequence', seq)}")


def report_where_the_ratio_comes_from(report):
    """The prose's "x2.9 longer", "x8.6 the pairs" and "the extra 0.06 comes from attention", computed."""
    n = report.num
    layers, width, mlp, _ = VIT_SIZES["B"]
    (_, _, s224, p224), (_, _, s384, p384) = sequence_shape(224, 16), sequence_shape(384, 16)
    compute_ratio = forward_gflops("B", 16, 384) / forward_gflops("B", 16, 224)
    report.line(f"ViT-B/16 from 224 to 384: sequence {s224} -> {s384} = "
                f"x{n('sequence 384 over 224', s384 / s224, '.1f')}, pairs per head "
                f"x{n('pairs 384 over 224', p384 / p224, '.1f')}, compute "
                f"x{n('compute 384 over 224', compute_ratio, '.2f')}")
    s16, s32 = sequence_shape(224, 16)[2], sequence_shape(224, 32)[2]
    total16, total32 = forward_gflops("B", 16, 224) * 1e9, forward_gflops("B", 32, 224) * 1e9
    embedding = patch_embedding_flops(224, 16, width)  # 2 N 3 P^2 D with N P^2 = 224^2: the same for /32
    per_token = token_flops(layers, width, mlp, s16) / token_flops(layers, width, mlp, s32)
    share32 = 100 * attention_flops(layers, width, s32) / total32
    share16 = 100 * attention_flops(layers, width, s16) / total16
    report.line(f"the extra {n('B/16 over B/32 compute above 4', total16 / total32 - 4, '.2f')} over x4: the per-token "
                f"parts grow x{n('per-token compute ratio', per_token, '.2f')} ({s16}/{s32} tokens; the [class] token "
                f"keeps it under 4), attention's pairs x{n('attention compute ratio', (s16 / s32) ** 2, '.2f')}; "
                f"attention is {n('attention share of B/32 (%)', share32, '.1f')}% of ViT-B/32's compute, "
                f"{n('attention share of B/16 (%)', share16, '.1f')}% of ViT-B/16's")
    with_embedding = (total16 + embedding) / (total32 + embedding)
    report.line(f"the patch embedding, left out above, costs both "
                f"{n('patch embedding GFLOPs', embedding / 1e9, '.2f')} GFLOPs "
                f"({n('patch embedding share of B/32 (%)', 100 * embedding / total32, '.1f')}% of ViT-B/32); "
                f"with it the ratio is x{n('B/16 over B/32 compute with the embedding', with_embedding, '.2f')}")


def section_parameters(run, report):
    """1b. parameters of the released checkpoints"""
    counts, sources = {}, {}
    for size, patch, name, pre_logits in RELEASED:
        shapes, sources[size, patch] = checkpoint_shapes(name, size, patch, pre_logits)
        counts[size, patch] = split_parameter_count(shapes)
    if all(source == "weight file" for source in sources.values()):
        report.subheader("parameters of the released checkpoints, read from the weight files (no head, no pre-logits "
                         "layer)")
    else:
        report.subheader("parameters of the released checkpoints (no head, no pre-logits layer); \"meta device\" = "
                         "counted from the Table 1 architecture, the weight file not being cached")
    n = report.num
    for size, patch, name, _ in RELEASED:
        backbone, pre_logits = counts[size, patch]
        key = f"ViT-{size}/{patch}"
        report.line(f"{key} ({name.split('/')[-1]}, {sources[size, patch]}): backbone "
                    f"{n(f'{key} backbone', backbone, '>11,')}  = "
                    f"{n(f'{key} backbone (M)', backbone / 1e6, '6.1f')}M   "
                    f"pre-logits layer {n(f'{key} pre-logits', pre_logits, '>9,')}   Table 1: {TABLE1_MILLIONS[size]}M")
    report_patch_size_difference(report, counts["B", 32][0], counts["B", 16][0])
    l32, l16 = sum(counts["L", 32]) / 1e6, counts["L", 16][0] / 1e6
    report.line(f"ViT-L/32 with its pre-logits layer: {n('ViT-L/32 with pre-logits (M)', l32, '.1f')}M; ViT-L/16 has "
                f"{n('ViT-L/16 without (M)', l16, '.1f')}M without one")


def report_patch_size_difference(report, b32, b16):
    """ViT-B/32 and ViT-B/16 differ only in the patch embedding E (P*P*3 x D) and the position table ((N+1) x D)."""
    n = report.num
    width = VIT_SIZES["B"][1]
    rows16, rows32 = sequence_shape(224, 16)[2], sequence_shape(224, 32)[2]
    report.line(f"ViT-B/32 minus ViT-B/16: {n('B/32 minus B/16', b32 - b16, ',')} parameters "
                f"({n('B/32 over B/16 percent', 100 * (b32 - b16) / b16, '.1f')}% more), because E grows from "
                f"{n('E rows at /16', 16 * 16 * 3)}x{width} to {n('E rows at /32', 32 * 32 * 3)}x{width} "
                f"(+{n('E growth', (32 * 32 * 3 - 16 * 16 * 3) * width, ',')}) and the position table shrinks from "
                f"{n('position rows at /16', rows16)} to {n('position rows at /32', rows32)} rows "
                f"(-{n('position table shrink', (rows16 - rows32) * width, ',')})")


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

def section_hybrid(run, report):
    """2. the hybrid's ResNet-50 stages"""
    report.header("2. the hybrid: which ResNet-50 stage feeds ViT")
    model, model_name = load_resnet50()
    pixels, picture = hybrid_picture()
    shapes = resnet_stage_shapes(model, pixels)
    n = report.num
    for stage, (channels, height, width) in enumerate(shapes, 1):
        key = f"stage {stage}"
        report.line(f"stage {stage} output: {n(f'{key} channels', channels, '>4')} channels x "
                    f"{n(f'{key} height', height, '>2')} x {n(f'{key} width', width, '<2')} -> as 1x1 patches: "
                    f"{n(f'{key} tokens', height * width, '>5')} tokens of {channels} numbers")
    tokens4, tokens3 = shapes[3][1] * shapes[3][2], shapes[2][1] * shapes[2][2]
    report.line(f"option (i), stage 4: {n('option (i) tokens', tokens4)} tokens; option (ii), extended stage 3: "
                f"{n('option (ii) tokens', tokens3)} tokens "
                f"= x{n('stage 3 over stage 4 tokens', tokens3 // tokens4)} (the \"4x longer sequence\")")
    batch_norms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    report.line(f"{model_name} is a standard ResNet: it has {n('BatchNorm2d layers', batch_norms)} BatchNorm2d layers "
                f"(BiT replaces each with Group Norm)")
    report.line(f"(picture: {picture}, resized to 224x224)")


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

def section_norms(run, report):
    """3. Batch Norm vs Group Norm"""
    report.header("3. Batch Norm vs Group Norm on a tiny batch (4 channels, 2 pixels per channel, 2 groups)")
    a = torch.tensor(PICTURE_A, dtype=torch.float64)
    report.line(f"picture A, channel 1 = {report.nums('picture A channel 1', a[0])}")
    torch_agrees = True
    for i, partner in enumerate((PARTNER_1, PARTNER_2), 1):
        batch = torch.stack([a, torch.tensor(partner, dtype=torch.float64)])
        by_hand = batch_norm(batch)
        note = "   (same picture, different output)" if i == 2 else ""
        report.line(f"Batch Norm, A batched with partner {i}: A channel 1 -> "
                    f"{report.nums(f'BN partner {i}', by_hand[0, 0], '6.3f')}{note}")
        torch_bn = torch.nn.BatchNorm1d(4, affine=False, eps=NORM_EPS, dtype=torch.float64).train()(batch)
        torch_gn = torch.nn.GroupNorm(2, 4, affine=False, eps=NORM_EPS, dtype=torch.float64)(batch)
        torch_agrees &= torch.allclose(torch_bn, by_hand, atol=1e-12)
        torch_agrees &= torch.allclose(torch_gn, group_norm(batch, 2), atol=1e-12)
    if not torch_agrees:
        raise RuntimeError("torch's BatchNorm/GroupNorm disagree with the by-hand formulas")
    group = a[:2].flatten()
    report.line(f"Group Norm, group 1 = channels 1 and 2 of A = {report.nums('GN group 1', group)}: "
                f"mean {report.num('GN group 1 mean', group.mean(), '.3f')}, "
                f"std {report.num('GN group 1 std', group.std(unbiased=False), '.3f')}")
    grouped = group_norm(a[None], 2)[0, 0]
    report.line(f"Group Norm: A channel 1 -> {report.nums('GN', grouped, '6.3f')} with any partner "
                f"(it never looks at the batch); torch GroupNorm agrees: {torch_agrees}")
    report.line(f"torch BatchNorm (training mode, batch statistics) agrees with both Batch Norm lines: {torch_agrees}")
    filters = torch.tensor([FILTER_1, FILTER_2], dtype=torch.float64)
    standardized = weight_standardize(filters)
    f2 = filters[1]
    report.line(f"Weight Standardization: filter 2 = {report.nums('filter 2', f2)}: "
                f"mean {report.num('WS filter 2 mean', f2.mean(), '.2f')}, "
                f"std {report.num('WS filter 2 std', f2.std(unbiased=False), '.4f')} -> "
                f"{report.nums('WS filter 2', standardized[1], '6.3f')}")
    report.line(f"filter 1 = {report.nums('filter 1', filters[0])} -> "
                f"{report.nums('WS filter 1', standardized[0], '6.3f')}   (every filter now has mean 0 and std 1 "
                f"before the convolution uses it)")


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

def section_adam(run, report):
    """4a. Adam by hand and by torch"""
    report.header("4. pre-training and fine-tuning by hand: Adam, Table 3, SGD with momentum, Polyak averaging, "
                  "clipping, Table 4")
    rows = adam_by_hand(GRADIENTS)
    for t, g, m, v, m_hat, v_hat, step, w in rows:
        def n(what, value, spec, t=t):
            return report.num(f"Adam t={t} {what}", value, spec)

        report.line(f"Adam t={t}: g={g:5.2f}  m={n('m', m, '.4f')}  v={n('v', v, '.6f')}  "
                    f"m_hat={n('m_hat', m_hat, '.4f')}  v_hat={n('v_hat', v_hat, '.4f')}  "
                    f"step = lr*m_hat/sqrt(v_hat) = {n('step', step, '.6f')}  w={n('w', w, '.6f')}")
    by_torch = torch_adam(GRADIENTS)
    report.line(f"torch.optim.Adam after the same three gradients: w={report.num('torch Adam w', by_torch, '.6f')}  "
                f"(ours {rows[-1][-1]:.6f})")


def section_pretraining(run, report):
    """4b. Table 3 in steps, and the warm-up"""
    report.print()
    n = report.num
    for label, epochs, pictures, base_lr, decay in TABLE3:
        steps = pretraining_steps(epochs, pictures)
        report.line(f"{label:<39}: {epochs:>3} epochs x {pictures / 1e6:6.2f}M images / batch {PRETRAIN_BATCH} = "
                    f"{n(f'{label}: steps', steps, '>9,')} steps; warm-up {PRETRAIN_WARMUP:,} = "
                    f"{n(f'{label}: warm-up %', 100 * PRETRAIN_WARMUP / steps, '4.1f')}% of them; "
                    f"base LR {base_lr:g}, {decay} decay")
    total = pretraining_steps(7, 303e6)
    middle = PRETRAIN_WARMUP + (total - PRETRAIN_WARMUP) // 2
    lrs = [warmup_linear_lr(s, 8e-4, total, PRETRAIN_WARMUP) for s in (5_000, 10_000, middle)]
    report.line(f"ViT-B/16 on JFT: LR at step 5,000 = {n('JFT LR at 5,000', lrs[0], '.1e')} (half way up the warm-up), "
                f"at 10,000 = {n('JFT LR at 10,000', lrs[1], '.1e')}, at the middle of the decay = "
                f"{n('JFT LR at mid-decay', lrs[2], '.1e')}")


def section_sgd_and_polyak(run, report):
    """4c. SGD with momentum and Polyak averaging"""
    report.print()
    rows = sgd_momentum_by_hand(GRADIENTS)
    for t, g, velocity, w in rows:
        report.line(f"SGD momentum 0.9, lr 0.01, t={t}: g={g:5.2f}  velocity = 0.9*velocity + g = "
                    f"{report.num(f'SGD t={t} velocity', velocity, '.4f')}  w = w - lr*velocity = "
                    f"{report.num(f'SGD t={t} w', w, '.5f')}")
    report.line(f"torch.optim.SGD(momentum=0.9) after the same gradients: "
                f"w={report.num('torch SGD w', torch_sgd(GRADIENTS), '.5f')}  (ours {rows[-1][-1]:.5f})")
    weights = [1.0, 1.2, 0.9, 1.1, 1.05]
    report.line(f"Polyak (exponential) averaging, factor 0.9: weights {report.nums('Polyak weights', weights)} -> "
                f"averages {report.nums('Polyak average', polyak_average(weights, 0.9))}")
    report.line(f"a factor of 0.9999 averages over roughly the last 1/(1 - 0.9999) = "
                f"{report.num('Polyak 0.9999 memory', 1 / (1 - 0.9999), ',.0f')} steps")


def section_clipping(run, report):
    """4d. clipping at global norm 1"""
    report.print()
    gradients = [[3.0, 0.0], [4.0]]
    norm, clipped = clip_by_global_norm(gradients, 1.0)
    report.line(f"clipping at global norm 1: gradients of two tensors [3, 0] and [4]; global norm sqrt(9 + 0 + 16) = "
                f"{report.num('clip global norm', norm, '.1f')} > 1, so every gradient is multiplied by 1/{norm:g}: "
                f"{report.nums('clipped [3, 0]', clipped[0])} and {report.nums('clipped [4]', clipped[1])}; "
                f"direction kept, length 1")
    by_torch = torch_clip(gradients, 1.0)
    report.line(f"torch.nn.utils.clip_grad_norm_: {report.nums('torch clipped [3, 0]', by_torch[0])} and "
                f"{report.nums('torch clipped [4]', by_torch[1])}")


def section_table4(run, report):
    """4e. Table 4 in steps and passes, and cosine decay"""
    report.print()
    n = report.num
    for task, steps, pictures in TABLE4:
        seen = steps * FINETUNE_BATCH
        report.line(f"{'fine-tuning ' + task:<31}: {steps:>6,} steps x batch {FINETUNE_BATCH} = "
                    f"{n(f'{task}: pictures seen (M)', seen / 1e6, '6.2f')}M pictures seen = "
                    f"{n(f'{task}: passes', seen / pictures, '7.1f')} passes over {pictures:,} training pictures")
    report.line("ImageNet fine-tuning at base LR 0.03, cosine: "
                + ", ".join(f"step {s:,} -> {n(f'cosine LR at {s:,}', cosine_lr(s, 0.03, 20_000), '.2g')}"
                            for s in (0, 10_000, 15_000, 20_000)))


SECTIONS = [section_table1, section_parameters, section_hybrid, section_norms, section_adam, section_pretraining,
            section_sgd_and_polyak, section_clipping, section_table4]


def main(argv=None):
    parser = script_parser(__doc__)
    add_common_arguments(parser, device=False)
    args = parser.parse_args(argv)
    torch.set_num_threads(min(4, torch.get_num_threads()))
    return run_sections("setup", Run(args), SECTIONS)


if __name__ == "__main__":
    sys.exit(guarded(main))
