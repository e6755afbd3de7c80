"""common/pretrained.py: ViT's sequence and forward compute, against the article's table (Table 1 sizes), the formula
worked out by hand and torch's FLOP counter on a real forward pass."""
import pytest
import torch

import vit_part3_setup as compute


def forward_gflops(size, patch, resolution):
    """A Table 1 model's forward compute at a resolution, as the setup script prints it."""
    return compute.encoder_flops(*compute.VIT_SIZES[size][:3], compute.sequence_shape(resolution, patch)[2]) / 1e9


def test_sequence_shapes_of_the_article():
    assert compute.sequence_shape(224, 16) == (14, 196, 197, 38_809)
    assert compute.sequence_shape(384, 16) == (24, 576, 577, 332_929)
    assert compute.sequence_shape(518, 14)[:3] == (37, 1369, 1370)


def test_forward_compute_matches_the_article():
    article = {("B", 32, 224): 8.6, ("B", 16, 224): 34.9, ("B", 16, 384): 110.3, ("L", 16, 384): 381.2,
               ("H", 14, 224): 334.2, ("H", 14, 384): 1005.9}
    for (size, patch, resolution), gflops in article.items():
        assert round(forward_gflops(size, patch, resolution), 1) == gflops
    ratio = forward_gflops("B", 16, 224) / forward_gflops("B", 32, 224)
    assert round(ratio, 2) == 4.06


def test_forward_compute_of_vit_b16_by_hand():
    """2 L (4 s D^2 + 2 s D M + 2 s^2 D), L 12, D 768, M 3072: s = 197 gives 24 x 1,453,954,560 FLOPs at 224; s = 577
    gives 110,287,687,680 at 384."""
    assert forward_gflops("B", 16, 224) == pytest.approx(34.89490944, rel=1e-13)
    config = compute.table1_config("B", 16)
    assert compute.config_forward_flops(config, 224) == 34_894_909_440
    assert compute.config_forward_flops(config, 384) == 110_287_687_680


def test_flop_formula_equals_torch_flop_counter():
    """torch counts every matmul of a real forward pass; ours leaves out only the patch embedding."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(hidden_size=32, num_hidden_layers=2, intermediate_size=80, num_attention_heads=4,
                       patch_size=16, image_size=64, attn_implementation="eager")
    model = ViTModel(config, add_pooling_layer=False).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(pixel_values=torch.zeros(1, 3, 64, 64))
    patches = (64 // 16) ** 2
    total = compute.encoder_flops(2, 32, 80, patches + 1) + compute.patch_embedding_flops(64, 16, 32)
    assert counter.get_total_flops() == total  # torch counts the patch embedding's convolution too
