"""The five scripts as the job runs them, one row each, in the job's order: the file; the article it reproduces; the
Quick check table's flags (a test reads both; fine-tuning's --save-dir there is OUT/finetune-run here; fine-tuning
pauses after the article's step-5 row, checking 5 of its pictures a class, and the backbone trains 2 epochs of 15
steps of 1 picture, so that each one's figure has more than one point); the pieces it downloads, its checkpoint
first (job/downloads.py), and those it runs without; the figures it draws into OUT/figures; the MB it writes into
OUT at most besides fine-tuning's checkpoint (its JSON, the backbone's with its feature maps' pictures, figures and
log); its times on the README's two machines (a test holds them equal; reproduce.py's REFERENCE)."""
from figures import backbone, fewshot, finetune, posemb
from job.downloads import BEANS, IMAGENETTE, IN21K, RESNET, VIT
from job.time_estimate import HOUR, MINUTE

PART3, BACKBONE = "ViT, explained · Part 3", "ViT as a backbone"
SCRIPTS = {
    "setup": {"file": "vit_part3_setup.py", "article": PART3, "quick": [],
              "needs": [], "optional": [RESNET],  # setup uses the architecture with random weights without it
              "figures": (), "writes MB": 1, "seconds": {"quick": 13, "full": 5}},
    "posemb": {"file": "vit_part3_posemb.py", "article": PART3, "quick": ["--per-class", "5"],
               "needs": [VIT, IMAGENETTE], "optional": [],
               "figures": (posemb.COSINE_FILE, posemb.ACCURACY_FILE), "writes MB": 3,
               "seconds": {"quick": 4.0 * MINUTE, "full": 2.3 * HOUR}},
    "fewshot": {"file": "vit_part3_fewshot.py", "article": PART3, "quick": ["--per-class", "10"],
                "needs": [IN21K, IMAGENETTE], "optional": [],
                "figures": (fewshot.FILE,), "writes MB": 2, "seconds": {"quick": 3.3 * MINUTE, "full": 10 * MINUTE}},
    "finetune": {"file": "vit_part3_finetune.py", "article": PART3,
                 "quick": ["--pause-at", "5", "--check-per-class", "5"],
                 "needs": [IN21K, IMAGENETTE], "optional": [],
                 "figures": (finetune.FILE,), "writes MB": 3, "seconds": {"quick": 4.5 * MINUTE, "full": 1.9 * HOUR}},
    "backbone": {"file": "vit_backbone.py", "article": BACKBONE,
                 "quick": ["--per-class", "5", "--epochs", "2", "--batch-size", "1", "--probe-epochs", "10"],
                 "needs": [VIT, BEANS], "optional": [],
                 "figures": (backbone.CURVES_FILE, backbone.MAPS_FILE), "writes MB": 5,
                 "seconds": {"quick": 1.7 * MINUTE, "full": 2 * HOUR}},
}
PAGE_WRITES_MB = 1  # the page, besides the scripts'


def script_file(script):
    return SCRIPTS[script]["file"]
