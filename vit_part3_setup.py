"""ViT, explained, Part 3: the setup numbers, offline.

Reproduces the article's arithmetic of Tables 1, 3 and 4: sequence lengths and forward compute of
every model/resolution, the parameter counts of the five released checkpoints, Batch Norm vs Group
Norm and Weight Standardization on a tiny batch, the ResNet-50 stages that can feed a hybrid, and
Adam, SGD with momentum, Polyak averaging and gradient clipping by hand against torch.

    python vit_part3_setup.py              # everything, offline, in seconds
    python vit_part3_setup.py --compare    # ... then this run's numbers beside the article's

Parameter counts come from the checkpoints' weight files when they are cached (a safetensors header,
or the tensors of a pytorch_model.bin, the only weight file two of the releases have), else from the
Hub's safetensors header when it answers, otherwise from the Table 1 architecture built on the meta
device. The ResNet-50 is microsoft/resnet-50 when cached (or reachable), otherwise the library's
architecture with random weights: the shapes and the layer count do not depend on the weights.
"""
from common.start_and_end import ARTICLE, UserError, before_torch_loads, guarded

if __name__ == "__main__":  # before torch loads: a Ctrl-C then is one line, as a later one
    before_torch_loads(ARTICLE)

import functools
import math
import os
import pickle
import sys
import zipfile

import numpy as np
import torch
import transformers  # its model classes load at their first use (its lazy module): the job's flag check loads none
from huggingface_hub import constants, get_safetensors_metadata, is_offline_mode
from PIL import Image
from safetensors import SafetensorError, safe_open

from common.paths import IMAGENETTE_DIR
from common.pretrained import HUB_ENDPOINT, VIT_SIZES, cached_weight_file, hub_name, load_pretrained, table1_config
from common.run import begin, conclude, experiment_parser, listed, section
from compare.published_files import checkpoint_difference, unlike_the_published

# Table 1's parameter counts (millions), its rows, and the released checkpoints; ViT-L/16's is the ImageNet
# fine-tuned one, without a pre-logits layer: the article's only cached file of ViT-L/16.
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
RESNET = "microsoft/resnet-50"  # the article's ResNet-50, section 2's checkpoint
# what makes a ResNetConfig ResNet-50's architecture (the library's defaults): a cached RESNET may be another
RESNET50_ARCHITECTURE = ("num_channels", "embedding_size", "hidden_sizes", "depths", "layer_type", "hidden_act",
                         "downsample_in_first_stage", "downsample_in_bottleneck")


# ---------------------------------------------------------------- 1. Table 1 and parameters

def read_safetensors_header(path):
    """{tensor name: shape} from a .safetensors file, reading only its header; a damaged file is one UserError.

    The safetensors library checks the header (its length, JSON, dtypes and byte ranges against the
    file's size) before it answers; the weights are never read.
    """
    try:
        with safe_open(path, framework="numpy") as f:
            return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 - safe_open is no dict
    except (SafetensorError, OSError, ValueError) as error:
        raise UserError(f"{path} is not a readable safetensors file ({str(error).splitlines()[0][:120]}): delete it "
                        f"to download it again") from error


def read_pytorch_shapes(path):
    """{tensor name: shape} from a pytorch_model.bin (torch.load, weights_only: tensors and plain containers only,
    memory-mapped when it is a zip archive, so the weights are not read into memory); a damaged file is one
    UserError."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except (pickle.UnpicklingError, RuntimeError, OSError, ValueError, EOFError) as error:
        raise UserError(f"{path} is not a readable PyTorch weight file ({str(error).splitlines()[0][:120]}): delete "
                        f"it to download it again") from error
    return {name: list(tensor.shape) for name, tensor in state.items() if isinstance(tensor, torch.Tensor)}


def read_weight_shapes(path):
    """{tensor name: shape} of a weight file, safetensors or pytorch_model.bin."""
    return read_safetensors_header(path) if str(path).endswith(".safetensors") else read_pytorch_shapes(path)


def split_parameter_count(shapes):
    """(backbone, pre-logits) numbers of a ViT state: the classifier head is left out of both.

    The pre-logits layer is the library's "pooler" (dense 768x768 + tanh in ViT-B); the head is the
    "classifier" of a fine-tuned checkpoint.
    """
    backbone = pre_logits = 0
    for name, shape in shapes.items():
        parts = name.split(".")
        if "pooler" in parts:
            pre_logits += math.prod(shape)
        elif parts[0] not in ("classifier", "head"):
            backbone += math.prod(shape)
    return backbone, pre_logits


def meta_parameter_shapes(config, pre_logits):
    """{name: shape} of a ViT built on the meta device (no memory, no weights), pooler if pre_logits."""
    with torch.device("meta"):
        model = transformers.ViTModel(config, add_pooling_layer=pre_logits)
    return {name: list(p.shape) for name, p in model.named_parameters()}


def checkpoint_shapes(name, size, patch, pre_logits):
    """({name: shape}, source): the cached weight file (safetensors, else pytorch_model.bin), else its safetensors
    header on the Hub, else meta."""
    path = cached_weight_file(name)
    if path:
        return read_weight_shapes(path), "weight file"
    if not is_offline_mode():  # the Hub's safetensors header, a few kB over HTTP
        try:
            files = get_safetensors_metadata(name).files_metadata.values()
        except Exception:  # noqa: BLE001 - no network, no safetensors file: the architecture below
            files = []
        shapes = {tensor: list(info.shape) for file in files for tensor, info in file.tensors.items()}
        if shapes:
            return shapes, "header from the Hub"
    return meta_parameter_shapes(table1_config(size, patch), pre_logits), "meta device"


# ViT's sequence and compute from its shapes: N = (R/P)^2, and forward FLOPs

def sequence_shape(resolution, patch):
    """grid side, N = (resolution/patch)^2 patches, sequence N+1, (N+1)^2 attention pairs per head."""
    grid = resolution // patch
    n = grid * grid
    return grid, n, n + 1, (n + 1) ** 2


def token_flops(layers, width, mlp, tokens):
    """The per-token part, in FLOPs (a multiply-add is 2): q, k, v, output (4 s D^2) and the MLP (2 s D M) a layer."""
    return 2 * layers * tokens * (4 * width**2 + 2 * width * mlp)


def attention_flops(layers, width, tokens):
    """The pairwise part: scores Q K^T and the weighted sum, 2 s^2 D multiply-adds a layer: 2 L 2 s^2 D FLOPs."""
    return 2 * layers * 2 * tokens**2 * width


def encoder_flops(layers, width, mlp, tokens):
    """The article's estimate of a ViT encoder's forward compute: FLOPs = 2 L (4 s D^2 + 2 s D M + 2 s^2 D), without
    the patch embedding (0.23 GFLOPs for every ViT-B at 224), norms, softmax and head."""
    return token_flops(layers, width, mlp, tokens) + attention_flops(layers, width, tokens)


def patch_embedding_flops(resolution, patch, width):
    """E maps each of the N patches of 3 P^2 numbers to D numbers: 2 N 3 P^2 D FLOPs."""
    return 2 * sequence_shape(resolution, patch)[1] * 3 * patch**2 * width


@section
def section_table1(report):
    """1. Table 1: sequence, attention pairs, forward compute and the released checkpoints' parameters
    (returns where those were read: released_parameters)"""
    layers, width, mlp, _ = VIT_SIZES["B"]
    (_, n16, s16, _), (_, n32, s32, _) = sequence_shape(224, 16), sequence_shape(224, 32)
    (_, _, s384, p384), p224 = sequence_shape(384, 16), sequence_shape(224, 16)[3]
    total16, total32 = encoder_flops(layers, width, mlp, s16), encoder_flops(layers, width, mlp, s32)
    embedding = patch_embedding_flops(224, 16, width)  # 2 N 3 P^2 D with N P^2 = 224^2: the same for /32
    # the prose's "x2.9 longer", "x8.6 the pairs" and "the extra 0.06 comes from attention", computed
    compute_ratio = encoder_flops(layers, width, mlp, s384) / total16
    per_token_ratio = token_flops(layers, width, mlp, s16) / token_flops(layers, width, mlp, s32)
    attention32 = 100 * attention_flops(layers, width, s32) / total32
    attention16 = 100 * attention_flops(layers, width, s16) / total16
    with_embedding = (total16 + embedding) / (total32 + embedding)
    patch_ratio, compute224, attention_ratio = n16 // n32, total16 / total32, (s16 / s32) ** 2
    report.print("\n== 1. Table 1 and the patch-size notation: ViT-<size>/<patch> ==")
    report.print("  N = (resolution / patch)^2 patches, plus 1 [class] token; attention compares every pair: (N+1)^2 "
                 "pairs per head")
    for size, patch in TABLE1_ROWS:
        for resolution in (224, 384):
            grid, patches, seq, pairs = sequence_shape(resolution, patch)
            key, gflops = f"ViT-{size}/{patch} at {resolution}", encoder_flops(*VIT_SIZES[size][:3], seq) / 1e9
            report.print(f"  {key}: grid {grid:>2}x{grid:<2} N = {patches:>4}  sequence {seq:>4}  pairs per head "
                         f"{pairs:>9,}  forward compute about {gflops:6.1f} GFLOPs",
                         {f"{key}: grid": grid, f"{key}: N": patches, f"{key}: sequence": seq, f"{key}: pairs": pairs,
                          f"{key}: GFLOPs": gflops})
    report.print(f"  ViT-B/16 vs ViT-B/32 at 224: {n16} vs {n32} patches = x{patch_ratio} (patch side halved, so "
                 f"(1/2)^-2 = 4); compute x{compute224:.2f}")
    report.print(f"  ViT-B/16 from 224 to 384: sequence {s16} -> {s384} = x{s384 / s16:.1f}, pairs per head x"
                 f"{p384 / p224:.1f}, compute x{compute_ratio:.2f}")
    report.print(f"  the extra {compute224 - 4:.2f} over x4: the per-token parts grow x{per_token_ratio:.2f} "
                 f"({s16}/{s32} tokens; the [class] token keeps it under 4), attention's pairs x{attention_ratio:.2f}; "
                 f"attention is {attention32:.1f}% of ViT-B/32's compute, {attention16:.1f}% of ViT-B/16's")
    report.print(f"  the patch embedding, left out above, costs both {embedding / 1e9:.2f} GFLOPs "
                 f"({100 * embedding / total32:.1f}% of ViT-B/32); with it the ratio is x{with_embedding:.2f}",
                 {"B/16 patches at 224": n16, "B/32 patches at 224": n32, "B/16 over B/32 patches": patch_ratio,
                  "B/16 over B/32 compute at 224": compute224, "sequence 384 over 224": s384 / s16,
                  "pairs 384 over 224": p384 / p224, "compute 384 over 224": compute_ratio,
                  "B/16 over B/32 compute above 4": compute224 - 4, "per-token compute ratio": per_token_ratio,
                  "attention compute ratio": attention_ratio, "attention share of B/32 (%)": attention32,
                  "attention share of B/16 (%)": attention16, "patch embedding GFLOPs": embedding / 1e9,
                  "patch embedding share of B/32 (%)": 100 * embedding / total32,
                  "B/16 over B/32 compute with the embedding": with_embedding})
    for size, patch, resolution in (("L", 16, 512), ("H", 14, 518)):
        grid, patches, seq, _ = sequence_shape(resolution, patch)
        key = f"ViT-{size}/{patch} at {resolution}"
        report.print(f"  Table 2 fine-tuning resolution: {key}: grid {grid}x{grid}, N = {patches}, sequence {seq}",
                     {f"{key}: grid": grid, f"{key}: N": patches, f"{key}: sequence": seq})

    return released_parameters(report)


def released_parameters(report):
    """Section 1's last lines: the parameters of the released checkpoints, read from their weight files (or counted
    from the Table 1 architecture on the meta device), against Table 1's; why ViT-B/32 has more than ViT-B/16.
    Returns where each checkpoint's were read ({Hub id: source})."""
    counts, sources = {}, {}
    for size, patch, name, pre_logits in RELEASED:
        shapes, sources[size, patch] = checkpoint_shapes(name, size, patch, pre_logits)
        counts[size, patch] = split_parameter_count(shapes)
    # ViT-B/32 and ViT-B/16 differ only in the patch embedding E (P*P*3 x D) and the position table ((N+1) x D)
    (b32, _), (b16, _), width = counts["B", 32], counts["B", 16], VIT_SIZES["B"][1]
    rows16, rows32 = sequence_shape(224, 16)[2], sequence_shape(224, 32)[2]
    if all(source == "weight file" for source in sources.values()):
        report.print("\n-- parameters of the released checkpoints, read from the weight files (no head, no "
                     "pre-logits layer) --")
    else:
        report.print("\n-- parameters of the released checkpoints (no head, no pre-logits layer); \"meta device\" = "
                     "counted from the Table 1 architecture, the weight file not being cached --")
    for size, patch, name, _ in RELEASED:
        backbone, pre_logits = counts[size, patch]
        key = f"ViT-{size}/{patch}"
        report.print(f"  {key} ({name.split('/')[-1]}, {sources[size, patch]}): backbone {backbone:>11,}  = "
                     f"{backbone / 1e6:6.1f}M   pre-logits layer {pre_logits:>9,}   Table 1: {TABLE1_MILLIONS[size]}M",
                     {f"{key} backbone": backbone, f"{key} backbone (M)": backbone / 1e6,
                      f"{key} pre-logits": pre_logits})
    e16, e32, l32, l16 = 16 * 16 * 3, 32 * 32 * 3, sum(counts["L", 32]) / 1e6, counts["L", 16][0] / 1e6
    report.print(f"  ViT-B/32 minus ViT-B/16: {b32 - b16:,} parameters ({100 * (b32 - b16) / b16:.1f}% more), because "
                 f"E grows from {e16}x{width} to {e32}x{width} (+{(e32 - e16) * width:,}) and the position table "
                 f"shrinks from {rows16} to {rows32} rows (-{(rows16 - rows32) * width:,})")
    report.print(f"  ViT-L/32 with its pre-logits layer: {l32:.1f}M; ViT-L/16 has {l16:.1f}M without one",
                 {"B/32 minus B/16": b32 - b16, "B/32 over B/16 percent": 100 * (b32 - b16) / b16,
                  "E rows at /16": e16, "E rows at /32": e32, "E growth": (e32 - e16) * width,
                  "position rows at /16": rows16, "position rows at /32": rows32,
                  "position table shrink": (rows16 - rows32) * width, "ViT-L/32 with pre-logits (M)": l32,
                  "ViT-L/16 without (M)": l16})
    return {name: sources[size, patch] for size, patch, name, _ in RELEASED}


# ---------------------------------------------------------------- 2. the hybrid

@section
def section_hybrid(report):
    """2. the hybrid's ResNet-50 stages
    (returns the checkpoint it read them from, RESNET, else the architecture's name)"""
    report.print("\n== 2. the hybrid: which ResNet-50 stage feeds ViT ==")
    try:  # microsoft/resnet-50 if cached or reachable, else random weights: the stage shapes do not depend on them
        model = load_pretrained(transformers.ResNetModel, RESNET, fix="run once online to download it").eval()
        model_name = RESNET
    except UserError as problem:
        torch.manual_seed(0)  # ResNetConfig's defaults are ResNet-50: bottleneck blocks, depths 3-4-6-3
        why = "microsoft/resnet-50 is not cached" if is_offline_mode() else problem
        model = transformers.ResNetModel(transformers.ResNetConfig()).eval()
        model_name = f"the library's ResNet-50 architecture (random weights; {why})"
    # the first Imagenette validation picture on disk, else a generated one: the shapes depend only on its size
    paths = sorted(IMAGENETTE_DIR.glob("val/*/*.JPEG"))
    try:
        with Image.open(paths[0]) as image:
            image, picture = image.convert("RGB"), str(paths[0])
    except (IndexError, OSError, ValueError, Image.DecompressionBombError) as error:  # none, or one that cannot be read
        noise = np.random.default_rng(0).integers(0, 256, size=(160, 213, 3), dtype=np.uint8)
        image, picture = Image.fromarray(noise), "a generated 213x160 picture of noise (" + (
            f"{paths[0]} cannot be read: {type(error).__name__})" if paths else "no Imagenette on disk)")
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])  # ImageNet statistics
    array = (np.asarray(image.resize((224, 224), Image.BILINEAR), dtype=np.float32) / 255 - mean) / std
    pixels = torch.from_numpy(array.astype(np.float32)).permute(2, 0, 1)[None]
    with torch.inference_mode():
        hidden = model(pixel_values=pixels, output_hidden_states=True).hidden_states
    shapes = [tuple(h.shape[1:]) for h in hidden[1:]]  # (channels, height, width) of each stage; hidden[0]: the stem
    tokens4, tokens3 = shapes[3][1] * shapes[3][2], shapes[2][1] * shapes[2][2]
    for stage, (channels, height, width) in enumerate(shapes, 1):
        report.print(f"  stage {stage} output: {channels:>4} channels x {height:>2} x {width:<2} -> as 1x1 patches: "
                     f"{height * width:>5} tokens of {channels} numbers",
                     {f"stage {stage} channels": channels, f"stage {stage} height": height,
                      f"stage {stage} width": width, f"stage {stage} tokens": height * width})
    batch_norms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    report.print(f"  option (i), stage 4: {tokens4} tokens; option (ii), extended stage 3: {tokens3} tokens = "
                 f"x{tokens3 // tokens4} (the \"4x longer sequence\")")
    resnet50 = transformers.ResNetConfig()
    standard = all(getattr(model.config, key, None) == getattr(resnet50, key) for key in RESNET50_ARCHITECTURE)
    kind = "a standard ResNet" if standard else "not a standard ResNet-50 (its config is another architecture)"
    report.print(f"  {model_name} is {kind}: it has {batch_norms} BatchNorm2d layers (BiT replaces each with Group "
                 "Norm)",
                 {"option (i) tokens": tokens4, "option (ii) tokens": tokens3,
                  "stage 3 over stage 4 tokens": tokens3 // tokens4, "BatchNorm2d layers": batch_norms})
    report.print(f"  (picture: {picture}, resized to 224x224)")
    return model_name


def setup_differences(sources, model_name, run, known):
    """The checkpoints sections 1 and 2 read their numbers from, where their bytes are not the article's
    (compare/published_files.py): section 1's cached weight files and a Hub mirror's headers (sources: {Hub id:
    source}; a count on the meta device is Table 1's architecture, exact), section 2's RESNET (model_name), not the
    library's architecture. A section that could not run gives none."""
    differences = checkpoint_difference(RESNET, RESNET, flag=RESNET) if model_name == RESNET else {}
    for name, source in ({} if isinstance(sources, UserError) else sources).items():
        if source == "weight file":
            path = cached_weight_file(name)
            unlike = (unlike_the_published(os.path.dirname(path), name, [os.path.basename(path)], "the cache's copy")
                      if path else "its weight file left the cache during the run")
        else:  # huggingface.co's header is the published file's; a mirror's cannot vouch for it
            unlike = (f"its safetensors header came from {hub_name()}, which cannot vouch for the article's file"
                      if source == "header from the Hub" and constants.ENDPOINT != HUB_ENDPOINT else None)
        if unlike:
            differences[name] = {"flag": name, "why": f"{name}: {unlike}"}
    return differences


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


@section
def section_norms(report):
    """3. Batch Norm vs Group Norm"""
    report.print("\n== 3. Batch Norm vs Group Norm on a tiny batch (4 channels, 2 pixels per channel, 2 groups) ==")
    a = torch.tensor(PICTURE_A, dtype=torch.float64)
    batches = [torch.stack([a, torch.tensor(partner, dtype=torch.float64)]) for partner in (PARTNER_1, PARTNER_2)]
    # torch's BatchNorm (training mode: the batch's statistics) and GroupNorm (2 groups) must give what ours give
    torch_bn = torch.nn.BatchNorm1d(4, affine=False, eps=NORM_EPS, dtype=torch.float64).train()
    torch_gn = torch.nn.GroupNorm(2, 4, affine=False, eps=NORM_EPS, dtype=torch.float64)
    torch_agrees = all(torch.allclose(torch_bn(batch), batch_norm(batch), atol=1e-12)
                       and torch.allclose(torch_gn(batch), group_norm(batch, 2), atol=1e-12) for batch in batches)
    if not torch_agrees:
        raise RuntimeError("torch's BatchNorm/GroupNorm disagree with the by-hand formulas")
    group, filters = a[:2].flatten(), torch.tensor([FILTER_1, FILTER_2], dtype=torch.float64)
    standardized = weight_standardize(filters)
    # A's channel 1 (its two pixels) after Batch Norm and Group Norm, A batched with partner 1, then partner 2
    bn, gn = [batch_norm(batch)[0, 0] for batch in batches], [group_norm(batch, 2)[0, 0] for batch in batches]
    group_mean, group_std = group.mean(), group.std(unbiased=False)
    filter_mean, filter_std = filters[1].mean(), filters[1].std(unbiased=False)
    report.print(f"  picture A, channel 1 = {listed(a[0])}")
    report.print(f"  Batch Norm, A batched with partner 1: A channel 1 -> {listed(bn[0], '6.3f')}")
    report.print(f"  Batch Norm, A batched with partner 2: A channel 1 -> {listed(bn[1], '6.3f')}   (same picture, "
                 "different output)")
    report.print(f"  Group Norm, group 1 = channels 1 and 2 of A = {listed(group)}: mean {group_mean:.3f}, std "
                 f"{group_std:.3f}")
    report.print(f"  Group Norm: A channel 1 -> {listed(gn[0], '6.3f')} with any partner (it never looks at the "
                 f"batch); torch GroupNorm agrees: {torch_agrees}")
    report.print("  torch BatchNorm (training mode, batch statistics) agrees with both Batch Norm lines: "
                 f"{torch_agrees}")
    report.print(f"  Weight Standardization: filter 2 = {listed(filters[1])}: mean {filter_mean:.2f}, std "
                 f"{filter_std:.4f} -> {listed(standardized[1], '6.3f')}")
    # the prose's "with any partner" and "every filter now has mean 0 and std 1", recorded for the conclusions
    means, stds = standardized.mean(dim=-1), standardized.std(dim=-1, unbiased=False)
    report.print(f"  filter 1 = {listed(filters[0])} -> {listed(standardized[0], '6.3f')}   (every filter now has mean "
                 "0 and std 1 before the convolution uses it)",
                 {"picture A channel 1": a[0], "BN partner 1": bn[0], "BN partner 2": bn[1], "GN group 1": group,
                  "GN group 1 mean": group_mean, "GN group 1 std": group_std, "GN": gn[0],
                  "filter 2": filters[1], "WS filter 2 mean": filter_mean, "WS filter 2 std": filter_std,
                  "WS filter 2": standardized[1], "filter 1": filters[0], "WS filter 1": standardized[0],
                  "GN partner 2": gn[1], "WS filters largest mean": means.abs().max(),
                  "WS filters smallest std": stds.min(), "WS filters largest std": stds.max()})


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


def warmup_linear_lr(step, base_lr, total_steps, warmup):
    """Pre-training's schedule: a linear warm-up from 0 to base_lr over `warmup` steps, then a linear decay to 0 at
    total_steps."""
    if step < warmup:
        return base_lr * step / warmup
    return base_lr * (total_steps - step) / (total_steps - warmup)


def cosine_lr(step, base_lr, total_steps):
    """The cosine decay: eta_t = eta_0 / 2 (1 + cos(pi t / T))."""
    return base_lr / 2 * (1 + math.cos(math.pi * step / total_steps))


def torch_optimizer_weight(optimizer_class, gradients, **settings):
    """w after torch's optimizer takes the given gradients, from w = 1 (float64)."""
    w = torch.nn.Parameter(torch.tensor(1.0, dtype=torch.float64))
    optimizer = optimizer_class([w], **settings)
    for g in gradients:
        w.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
    return w.item()


def torch_clip(gradients, max_norm):
    params = [torch.nn.Parameter(torch.zeros(len(g), dtype=torch.float64)) for g in gradients]
    for p, g in zip(params, gradients, strict=True):
        p.grad = torch.tensor(g, dtype=torch.float64)
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    return [p.grad.tolist() for p in params]


@section
def section_by_hand(report):
    """4. Adam, Table 3, SGD with momentum, Polyak averaging, clipping and Table 4 by hand"""
    report.print("\n== 4. pre-training and fine-tuning by hand: Adam, Table 3, SGD with momentum, Polyak averaging, "
                 "clipping, Table 4 ==")
    # Adam by hand and by torch
    rows, by_torch = adam_by_hand(GRADIENTS), torch_optimizer_weight(torch.optim.Adam, GRADIENTS, lr=1e-3)
    for t, g, m, v, m_hat, v_hat, step, w in rows:
        report.print(f"  Adam t={t}: g={g:5.2f}  m={m:.4f}  v={v:.6f}  m_hat={m_hat:.4f}  v_hat={v_hat:.4f}  step = "
                     f"lr*m_hat/sqrt(v_hat) = {step:.6f}  w={w:.6f}",
                     {f"Adam t={t} m": m, f"Adam t={t} v": v, f"Adam t={t} m_hat": m_hat, f"Adam t={t} v_hat": v_hat,
                      f"Adam t={t} step": step, f"Adam t={t} w": w})
    report.print(f"  torch.optim.Adam after the same three gradients: w={by_torch:.6f}  (ours {rows[-1][-1]:.6f})",
                 {"torch Adam w": by_torch,  # and the prose's "whatever the size of the gradient"
                  **{f"Adam t=1 step at g={g:g}": adam_by_hand([g])[0][6] for g in (0.001, 1000)}})

    table3_in_steps(report)

    # SGD with momentum and Polyak averaging
    report.print()
    rows = sgd_momentum_by_hand(GRADIENTS)
    weights = [1.0, 1.2, 0.9, 1.1, 1.05]
    for t, g, velocity, w in rows:
        report.print(f"  SGD momentum 0.9, lr 0.01, t={t}: g={g:5.2f}  velocity = 0.9*velocity + g = {velocity:.4f}  "
                     f"w = w - lr*velocity = {w:.5f}",
                     {f"SGD t={t} velocity": velocity, f"SGD t={t} w": w})
    by_torch = torch_optimizer_weight(torch.optim.SGD, GRADIENTS, lr=0.01, momentum=0.9)
    averages = polyak_average(weights, 0.9)
    report.print(f"  torch.optim.SGD(momentum=0.9) after the same gradients: w={by_torch:.5f}  (ours "
                 f"{rows[-1][-1]:.5f})")
    report.print(f"  Polyak (exponential) averaging, factor 0.9: weights {listed(weights)} -> averages "
                 f"{listed(averages)}")
    report.print(f"  a factor of 0.9999 averages over roughly the last 1/(1 - 0.9999) = {1 / (1 - 0.9999):,.0f} steps",
                 {"torch SGD w": by_torch, "Polyak weights": weights, "Polyak average": averages,
                  "Polyak 0.9999 memory": 1 / (1 - 0.9999)})

    # clipping at global norm 1
    report.print()
    gradients = [[3.0, 0.0], [4.0]]
    norm, clipped = clip_by_global_norm(gradients, 1.0)
    by_torch = torch_clip(gradients, 1.0)
    report.print("  clipping at global norm 1: gradients of two tensors [3, 0] and [4]; global norm sqrt(9 + 0 + 16) = "
                 f"{norm:.1f} > 1, so every gradient is multiplied by 1/{norm:g}: {listed(clipped[0])} and "
                 f"{listed(clipped[1])}; direction kept, length 1")
    # the line's "length 1" and "direction kept", recorded for the conclusions
    flat, before = [g for tensor in clipped for g in tensor], [g for tensor in gradients for g in tensor]
    cosine = sum(a * b for a, b in zip(flat, before, strict=True)) / norm
    report.print(f"  torch.nn.utils.clip_grad_norm_: {listed(by_torch[0])} and {listed(by_torch[1])}",
                 {"clip global norm": norm, "clipped [3, 0]": clipped[0], "clipped [4]": clipped[1],
                  "torch clipped [3, 0]": by_torch[0], "torch clipped [4]": by_torch[1],
                  "clipped length": math.sqrt(sum(g * g for g in flat)), "clipped cosine with the gradient": cosine})

    table4_in_steps(report)


def table3_in_steps(report):
    """Section 4's Table 3 in steps, the warm-up's share of them, and ViT-B/16's learning rate on JFT."""
    report.print()
    for label, epochs, pictures, base_lr, decay in TABLE3:
        steps = pretraining_steps(epochs, pictures)
        warmup_share = 100 * PRETRAIN_WARMUP / steps
        report.print(f"  {label:<39}: {epochs:>3} epochs x {pictures / 1e6:6.2f}M images / batch {PRETRAIN_BATCH} = "
                     f"{steps:>9,} steps; warm-up {PRETRAIN_WARMUP:,} = {warmup_share:4.1f}% of them; base LR "
                     f"{base_lr:g}, {decay} decay",
                     {f"{label}: steps": steps, f"{label}: warm-up %": warmup_share})
    total = pretraining_steps(7, 303e6)
    at_5000, at_10000, at_middle = (warmup_linear_lr(step, 8e-4, total, PRETRAIN_WARMUP) for step in
                                    (5_000, 10_000, PRETRAIN_WARMUP + (total - PRETRAIN_WARMUP) // 2))
    report.print(f"  ViT-B/16 on JFT: LR at step 5,000 = {at_5000:.1e} (half way up the warm-up), at 10,000 = "
                 f"{at_10000:.1e}, at the middle of the decay = {at_middle:.1e}",
                 {"JFT LR at 5,000": at_5000, "JFT LR at 10,000": at_10000, "JFT LR at mid-decay": at_middle})


def table4_in_steps(report):
    """Section 4's Table 4 in steps and passes, and the cosine decay of ImageNet fine-tuning."""
    report.print()
    for task, steps, pictures in TABLE4:
        seen = steps * FINETUNE_BATCH
        report.print(f"  {f'fine-tuning {task}':<31}: {steps:>6,} steps x batch {FINETUNE_BATCH} = {seen / 1e6:6.2f}M "
                     f"pictures seen = {seen / pictures:7.1f} passes over {pictures:,} training pictures",
                     {f"{task}: pictures seen (M)": seen / 1e6, f"{task}: passes": seen / pictures})
    rates = {step: cosine_lr(step, 0.03, 20_000) for step in (0, 10_000, 15_000, 20_000)}
    report.print("  ImageNet fine-tuning at base LR 0.03, cosine: "
                 f"{', '.join(f'step {step:,} -> {rate:.2g}' for step, rate in rates.items())}",
                 {f"cosine LR at {step:,}": rate for step, rate in rates.items()})


def main(argv=None):
    args = experiment_parser(__doc__, device=False).parse_args(argv)
    torch.set_num_threads(min(4, torch.get_num_threads()))
    run, report = begin("setup", args)
    sources = section_table1(report)
    model_name = section_hybrid(report)
    section_norms(report)
    section_by_hand(report)
    return conclude(run, report, functools.partial(setup_differences, sources, model_name))


if __name__ == "__main__":
    sys.exit(guarded(main))
