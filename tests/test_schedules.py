"""common/schedules.py: pre-training's warm-up and linear decay and the cosine decay, at the article's steps by hand.

Fine-tuning's warm-up and cosine (warmup_cosine_lr, through the script's lr_at) is held at every one of the 300 steps
in tests/test_finetune_maths.py, against torch's CosineAnnealingLR, and by hand in tests/test_finetune.py.
"""
import math

import pytest

from common import schedules


def test_warmup_and_linear_decay_of_the_article():
    """ViT-L/16's 7 epochs of JFT: 517,822 steps (vit_part3_setup.pretraining_steps), 10,000 of warm-up to 8e-4."""
    total = 517_822
    assert schedules.warmup_linear_lr(5_000, 8e-4, total, 10_000) == pytest.approx(4e-4)
    assert schedules.warmup_linear_lr(10_000, 8e-4, total, 10_000) == pytest.approx(8e-4)
    assert schedules.warmup_linear_lr(total, 8e-4, total, 10_000) == 0


def test_cosine_decay_of_the_article():
    # cos(3 pi / 4) = -sqrt(2)/2, so step 15,000 of 20,000 is 0.015 (1 - 0.7071) = 0.0044
    assert schedules.cosine_lr(15_000, 0.03, 20_000) == pytest.approx(0.015 * (1 - math.sqrt(0.5)))
    assert schedules.cosine_lr(10_000, 0.03, 20_000) == pytest.approx(0.015)
    assert schedules.cosine_lr(20_000, 0.03, 20_000) == 0
