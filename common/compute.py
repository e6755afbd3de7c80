"""ViT's sequence and compute from its shapes: Table 1's sizes, N = (R/P)^2, and forward FLOPs."""

# Table 1 of the paper: layers, hidden size D, MLP size, heads.
VIT_SIZES = {"B": (12, 768, 3072, 12), "L": (24, 1024, 4096, 16), "H": (32, 1280, 5120, 16)}


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


def table1_config(size, patch, image_size=224, **fields):
    """A transformers ViTConfig of a Table 1 size (fields: any other of its fields, num_labels=1000)."""
    from transformers import ViTConfig

    layers, width, mlp, heads = VIT_SIZES[size]
    return ViTConfig(hidden_size=width, num_hidden_layers=layers, intermediate_size=mlp,
                     num_attention_heads=heads, patch_size=patch, image_size=image_size, **fields)


def config_forward_flops(config, resolution):
    """encoder_flops of a ViTConfig at a resolution."""
    tokens = sequence_shape(resolution, config.patch_size)[2]
    return encoder_flops(config.num_hidden_layers, config.hidden_size, config.intermediate_size, tokens)
