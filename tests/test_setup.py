"""vit_part3_setup.py against the article's hand-checked values and independent implementations."""
import argparse
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ARTICLE, ROOT
from PIL import Image

import vit_part3_setup as setup
from common.run import Report
from common.start_and_end import UserError

# ---------------------------------------------------------------- parameters


def test_meta_count_equals_a_saved_checkpoint_header(tmp_path):
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(hidden_size=48, num_hidden_layers=2, intermediate_size=96, num_attention_heads=4,
                       patch_size=8, image_size=32)
    ViTModel(config, add_pooling_layer=True).save_pretrained(tmp_path)
    from_file = setup.split_parameter_count(setup.read_safetensors_header(tmp_path / "model.safetensors"))
    assert from_file == setup.split_parameter_count(setup.meta_parameter_shapes(config, pre_logits=True))
    assert from_file[1] == 48 * 48 + 48  # the pooler: dense D x D plus bias


def pickled_only_checkpoint(folder, pre_logits=True):
    """A tiny ViTModel whose only weight file is pytorch_model.bin, as the Hub holds google/vit-large-patch16-224 and
    google/vit-large-patch32-224-in21k (transformers 4.x's save_pretrained(safe_serialization=False) wrote it with
    torch.save; transformers 5 no longer writes one). Returns (its backbone count, its pooler count), each the sum of
    numel over the model's own parameters."""
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(hidden_size=24, num_hidden_layers=1, intermediate_size=40, num_attention_heads=2, patch_size=8,
                       image_size=32)
    model = ViTModel(config, add_pooling_layer=pre_logits)
    model.save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    pooler = sum(p.numel() for name, p in model.named_parameters() if name.startswith("pooler."))
    return sum(p.numel() for p in model.parameters()) - pooler, pooler


def test_a_checkpoint_with_only_pytorch_model_bin_is_counted_from_its_file(tmp_path):
    folder = tmp_path / "vit"
    folder.mkdir()
    counts = pickled_only_checkpoint(folder)
    assert counts[1] == 24 * 24 + 24  # the pooler: dense D x D plus bias
    shapes, source = setup.checkpoint_shapes(str(folder), "L", 16, True)
    assert source == "weight file" and setup.split_parameter_count(shapes) == counts


def test_a_cached_pytorch_model_bin_is_read_where_the_hub_has_no_safetensors(tmp_path, monkeypatch):
    """The Hugging Face cache after from_pretrained downloaded google/vit-large-patch16-224: refs/main, the snapshot
    holding pytorch_model.bin, and .no_exist/ noting that the revision has no model.safetensors."""
    from huggingface_hub import constants

    name, revision = "google/vit-large-patch16-224", "a" * 40
    repo = tmp_path / "hub" / "models--google--vit-large-patch16-224"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / ".no_exist" / revision).mkdir(parents=True)
    (repo / ".no_exist" / revision / "model.safetensors").write_text("")
    counts = pickled_only_checkpoint(repo / "snapshots" / revision, pre_logits=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    shapes, source = setup.checkpoint_shapes(name, "L", 16, False)
    assert source == "weight file" and setup.split_parameter_count(shapes) == counts
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))  # not cached: the architecture, offline
    assert setup.checkpoint_shapes(name, "L", 16, False)[1] == "meta device"


def test_a_damaged_pytorch_model_bin_is_one_line(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not a weight file")
    with pytest.raises(UserError, match="pytorch_model.bin is not a readable PyTorch weight file"):
        setup.checkpoint_shapes(str(tmp_path), "L", 16, False)


def test_head_is_counted_in_neither_part():
    shapes = {"vit.embeddings.cls_token": [1, 1, 4], "vit.pooler.dense.weight": [4, 4],
              "classifier.weight": [10, 4], "classifier.bias": [10]}
    assert setup.split_parameter_count(shapes) == (4, 16)


def test_released_counts_from_the_architecture():
    b16 = setup.split_parameter_count(setup.meta_parameter_shapes(setup.table1_config("B", 16), True))
    l16 = setup.split_parameter_count(setup.meta_parameter_shapes(setup.table1_config("L", 16), False))
    assert b16 == (85_798_656, 590_592)
    assert l16 == (303_301_632, 0)


# ---------------------------------------------------------------- norms

def test_batch_norm_of_the_article_and_of_torch():
    a = torch.tensor(setup.PICTURE_A)
    for partner, expected in ((setup.PARTNER_1, [-1.260, -0.700]), (setup.PARTNER_2, [0.632, 1.265])):
        batch = torch.stack([a, torch.tensor(partner)])
        ours = setup.batch_norm(batch)
        assert ours[0, 0].tolist() == pytest.approx(expected, abs=5e-4)
    batch = torch.randn(5, 6, 7, dtype=torch.float64)
    torch_bn = torch.nn.BatchNorm1d(6, affine=False, dtype=torch.float64).train()(batch)
    assert torch.allclose(setup.batch_norm(batch), torch_bn, atol=1e-12)


def test_group_norm_of_the_article_and_of_torch():
    a = torch.tensor([setup.PICTURE_A])
    assert setup.group_norm(a, 2)[0, 0].tolist() == pytest.approx([-1 / math.sqrt(0.5), 1 / math.sqrt(0.5)], abs=1e-4)
    batch = torch.randn(3, 8, 5, dtype=torch.float64)
    torch_gn = torch.nn.GroupNorm(4, 8, affine=False, dtype=torch.float64)(batch)
    assert torch.allclose(setup.group_norm(batch, 4), torch_gn, atol=1e-12)


def test_weight_standardization_of_the_article_is_over_the_last_dimension_with_its_eps():
    """The article's filters; its second, [1, 2, 3, 2]: mean 2, variance 0.5, so (w - 2) / sqrt(0.5) =
    [-sqrt 2, 0, sqrt 2, 0]; with eps 1, divided by sqrt(1.5) instead. Two filter sets of two filters, the first
    filter the article's second: each filter (last dimension) on its own."""
    article = setup.weight_standardize(torch.tensor([setup.FILTER_1, setup.FILTER_2], dtype=torch.float64))
    assert article[0].tolist() == pytest.approx([0.218, -1.091, 1.528, -0.655], abs=5e-4)
    filters = torch.tensor([[setup.FILTER_2, [2.0, 4.0, 6.0, 4.0]],
                            [[3.0, 2.0, 1.0, 2.0], [0.0, 0.0, 0.0, 4.0]]], dtype=torch.float64)
    s = math.sqrt(2)
    expected = [[[-s, 0, s, 0], [-s, 0, s, 0]], [[s, 0, -s, 0], [-1 / math.sqrt(3), -1 / math.sqrt(3),
                                                                  -1 / math.sqrt(3), math.sqrt(3)]]]
    np.testing.assert_allclose(setup.weight_standardize(filters).numpy(), expected, rtol=0, atol=1e-12)
    with_eps = setup.weight_standardize(filters[0, :1], eps=1.0)
    np.testing.assert_allclose(with_eps.numpy(), [[-1 / math.sqrt(1.5), 0, 1 / math.sqrt(1.5), 0]], rtol=0, atol=1e-12)


# ---------------------------------------------------------------- optimizers and schedules

def test_adam_by_hand_of_the_article():
    rows = setup.adam_by_hand([0.5, -0.1, 0.3])
    _, _, m, v, m_hat, v_hat, step, _ = rows[0]
    assert (m, v, m_hat, v_hat) == pytest.approx((0.05, 0.00025, 0.5, 0.25))
    assert step == pytest.approx(0.001, rel=1e-6)  # the first step of Adam is lr long
    assert [r[-1] for r in rows] == pytest.approx([0.999000, 0.998489, 0.997824], abs=5e-7)


def test_adam_by_hand_equals_torch_on_random_gradients():
    gradients = torch.randn(20, generator=torch.Generator().manual_seed(1)).tolist()
    by_torch = setup.torch_optimizer_weight(torch.optim.Adam, gradients, lr=0.01)
    assert setup.adam_by_hand(gradients, lr=0.01)[-1][-1] == pytest.approx(by_torch, abs=1e-12)


def test_sgd_momentum_by_hand():
    rows = setup.sgd_momentum_by_hand([0.5, -0.1, 0.3])
    assert [r[2] for r in rows] == pytest.approx([0.5, 0.35, 0.615])
    assert [r[3] for r in rows] == pytest.approx([0.995, 0.9915, 0.98535])
    gradients = torch.randn(20, generator=torch.Generator().manual_seed(2)).tolist()
    assert setup.sgd_momentum_by_hand(gradients)[-1][-1] == pytest.approx(
        setup.torch_optimizer_weight(torch.optim.SGD, gradients, lr=0.01, momentum=0.9), abs=1e-12)


def test_the_optimizer_rows_count_steps_from_1():
    assert [row[0] for row in setup.sgd_momentum_by_hand([0.5, -0.1, 0.3])] == [1, 2, 3]
    assert [row[0] for row in setup.adam_by_hand([0.5, -0.1, 0.3])] == [1, 2, 3]


def test_torch_adam_with_its_default_lr_gives_the_articles_weight():
    """The article's line: torch.optim.Adam after the same three gradients: w=0.997824 (lr 0.001)."""
    gradients = [0.5, -0.1, 0.3]
    assert setup.torch_optimizer_weight(torch.optim.Adam, gradients, lr=1e-3) == pytest.approx(0.997824, abs=5e-7)
    assert setup.torch_optimizer_weight(torch.optim.SGD, gradients, lr=0.01, momentum=0.9) == pytest.approx(
        0.98535, abs=5e-6)


def test_polyak_average_equals_torch_ema():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    weights = [1.0, 1.2, 0.9, 1.1, 1.05]
    assert setup.polyak_average(weights, 0.9) == pytest.approx([1.0, 1.02, 1.008, 1.0172, 1.02048])
    model = torch.nn.Linear(1, 1, bias=False).double()
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    torch_averages = []
    for w in weights:
        model.weight.data.fill_(w)
        ema.update_parameters(model)
        torch_averages.append(ema.module.weight.item())
    assert setup.polyak_average(weights, 0.9) == pytest.approx(torch_averages, abs=1e-12)


def test_clipping_equals_torch():
    norm, clipped = setup.clip_by_global_norm([[3.0, 0.0], [4.0]], 1.0)
    assert norm == 5.0 and clipped[0] == pytest.approx([0.6, 0.0]) and clipped[1] == pytest.approx([0.8])
    gradients = [torch.randn(3).tolist(), torch.randn(5).tolist()]
    for max_norm in (0.5, 100.0):  # clipped, and left alone
        ours = setup.clip_by_global_norm(gradients, max_norm)[1]
        by_torch = setup.torch_clip(gradients, max_norm)
        assert [x for t in ours for x in t] == pytest.approx([x for t in by_torch for x in t], abs=1e-6)


def test_pretraining_steps_of_the_article():
    assert setup.pretraining_steps(7, 303e6) == 517_822
    assert setup.pretraining_steps(14, 303e6) == 1_035_645


def test_warmup_and_linear_decay_of_the_article():
    """ViT-L/16's 7 epochs of JFT: 517,822 steps, 10,000 of warm-up to 8e-4."""
    total = 517_822
    assert setup.warmup_linear_lr(5_000, 8e-4, total, 10_000) == pytest.approx(4e-4)
    assert setup.warmup_linear_lr(10_000, 8e-4, total, 10_000) == pytest.approx(8e-4)
    assert setup.warmup_linear_lr(total, 8e-4, total, 10_000) == 0


def test_cosine_decay_of_the_article():
    # cos(3 pi / 4) = -sqrt(2)/2, so step 15,000 of 20,000 is 0.015 (1 - 0.7071) = 0.0044
    assert setup.cosine_lr(15_000, 0.03, 20_000) == pytest.approx(0.015 * (1 - math.sqrt(0.5)))
    assert setup.cosine_lr(10_000, 0.03, 20_000) == pytest.approx(0.015)
    assert setup.cosine_lr(20_000, 0.03, 20_000) == 0


# ---------------------------------------------------------------- the script as a user runs it

def article_setup_lines():
    """The article's logged lines that vit_part3_setup.py prints, as the offline run prints them."""
    text = ARTICLE.read_text().splitlines()
    starts = ("== 1. Table 1", "== 2. the hybrid", "== 3. Batch Norm")
    prefixes = ("  Adam t=", "  torch.optim.", "  pre-training", "  ViT-B/16 on JFT", "  SGD momentum", "  Polyak",
                "  a factor of", "  clipping at", "  torch.nn.utils", "  fine-tuning ", "  ImageNet fine-tuning")
    lines, inside = [], False
    for text_line in text:
        if text_line.startswith(starts):
            inside = True
        elif inside and not text_line.startswith(("  ", "-- ")) and text_line.strip():
            inside = False
        if (inside and text_line.strip()) or text_line.startswith(prefixes):
            lines.append(text_line.replace(", weight file)", ", meta device)").replace(
                "  microsoft/resnet-50 is", "  the library's ResNet-50 architecture (random weights; "
                                            "microsoft/resnet-50 is not cached) is"))
    return [text for text in lines if not text.startswith("-- parameters")]


@pytest.mark.skipif(not ARTICLE.exists(), reason="the article is not beside the checkout")
def test_script_prints_every_article_line_offline():
    run = subprocess.run([sys.executable, "vit_part3_setup.py", "--compare"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    printed = set(run.stdout.splitlines())
    expected = article_setup_lines()
    assert len(expected) > 60
    assert [text for text in expected if text not in printed] == []
    counts = (r"(\d+) same, 0 close, 0 differs, 0 undecided, 0 varies, 0 not comparable, 0 not run "
              r"\(of \1 article numbers\)")
    assert re.search(counts, run.stdout)


# ---------------------------------------------------------------- Table 1's sequence and forward compute
# against the article's table (Table 1 sizes), the formula worked out by hand and torch's FLOP counter on a real
# forward pass

def forward_gflops(size, patch, resolution):
    """A Table 1 model's forward compute at a resolution, as the setup script prints it."""
    return setup.encoder_flops(*setup.VIT_SIZES[size][:3], setup.sequence_shape(resolution, patch)[2]) / 1e9


@pytest.mark.parametrize("section,broken", [(1, "read_weight_shapes"), (2, "IMAGENETTE_DIR")],
                         ids=["Table 1", "the hybrid"])
def test_a_section_that_cannot_run_is_named_by_its_title_alone(section, broken, monkeypatch, capsys, tmp_path):
    """A section's title is its docstring's first line, as the article's heading reads; what it returns is said on
    the lines below, never in the title."""
    def refuse(*args, **kwargs):
        raise UserError("no way")

    monkeypatch.setattr(setup, "cached_weight_file", lambda name: tmp_path / "model.safetensors")
    monkeypatch.setattr(setup, broken, argparse.Namespace(glob=refuse) if broken == "IMAGENETTE_DIR" else refuse)
    title = {1: "1. Table 1: sequence, attention pairs, forward compute and the released checkpoints' parameters",
             2: "2. the hybrid's ResNet-50 stages"}[section]
    assert setup.main([]) == 1
    assert f'  cannot run section "{title}": no way' in capsys.readouterr().out.splitlines()


# (the first validation picture of the data folder: its bytes, the picture the hybrid's line names): shapes need
# only a picture's size, so one that cannot be read gives way to noise, named
FIRST_PICTURES = [
    (None, "a generated 213x160 picture of noise (no Imagenette on disk)"),
    (b"", "a generated 213x160 picture of noise ({path} cannot be read: UnidentifiedImageError)"),
    ("a picture cut short", "a generated 213x160 picture of noise ({path} cannot be read: OSError)"),
    ("a picture", "{path}"),
]


@pytest.mark.parametrize("content,named", FIRST_PICTURES, ids=["none", "empty", "cut short", "a picture"])
def test_the_hybrids_picture_is_the_first_one_that_can_be_read_else_noise(content, named, tmp_path, monkeypatch,
                                                                          capsys):
    monkeypatch.setattr(setup, "IMAGENETTE_DIR", tmp_path)
    path = tmp_path / "val" / "n01440764" / "a.JPEG"
    if content is not None:
        path.parent.mkdir(parents=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            Image.effect_noise((213, 160), 64).convert("RGB").save(path)
        if content == "a picture cut short":  # its header whole, its pixels not
            path.write_bytes(path.read_bytes()[:2000])
    report = Report("setup", quiet=True)
    setup.section_hybrid(report)
    assert f"  (picture: {named.format(path=path)}, resized to 224x224)" in report.lines
    assert not report.could_not_run


def test_sequence_shapes_of_the_article():
    assert setup.sequence_shape(224, 16) == (14, 196, 197, 38_809)
    assert setup.sequence_shape(384, 16) == (24, 576, 577, 332_929)
    assert setup.sequence_shape(518, 14)[:3] == (37, 1369, 1370)


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
    assert setup.encoder_flops(12, 768, 3072, 197) == 34_894_909_440
    assert setup.encoder_flops(12, 768, 3072, 577) == 110_287_687_680


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
    total = setup.encoder_flops(2, 32, 80, patches + 1) + setup.patch_embedding_flops(64, 16, 32)
    assert counter.get_total_flops() == total  # torch counts the patch embedding's convolution too
