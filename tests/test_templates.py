"""Each logged line is one f-string, and every one is a line of the articles (its fields masked), or listed here as
the project's own with the reason: the layout cannot drift from the articles silently.

The f-strings are read from the scripts' source: every report.print call of a logged line ("  ..."), a section's
title ("\n== ... ==") or a subheader ("\n-- ... --"), whose argument must be an f-string or a string.
"""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTICLES = ROOT.parent / "shared" / "article"
SCRIPTS = ("vit_part3_setup.py", "vit_part3_posemb.py", "vit_part3_fewshot.py", "vit_part3_finetune.py",
           "vit_backbone.py")
# report.print's frames in the source (start, end), and as the article prints them
FRAMES = {"header": ("\n== ", " =="), "subheader": ("\n-- ", " --"), "line": ("  ", "")}
PRINTED = {"line": "  {}", "header": "== {} ==", "subheader": "-- {} --"}
FIELD = re.compile(r"\{\{|\}\}|\{[^{}]*\}")

# The lines that are the project's own, not the articles': template -> why it is printed. A backbone template with
# fewer than 10 letters of its own (a row of numbers) cannot be found in the article's prose: it is listed too.
PROJECT_LINES = {
    "": "an empty line (the backbone article's print('\\n', end='') between its two dicts)",
    # vit_part3_finetune.py
    "passes over pictures (this process's): training, {steps} steps {training}; the checks of the validation subset, "
    "{checked:,} pictures in all {checks}{finals}; the loaders' {workers} worker processes each (none on a CPU, whose "
    "cores the model uses) started in {start_up:.1f} s, outside the passes": "the wait for pictures of each pass",
    "on all {pictures:,} validation pictures: the weight average (factor {factor}) {average accuracy:.2f}%, the last "
    "weights {last accuracy:.2f}%": "the two accuracies the article's prose states (99.52% and 99.57%)",
    "resumed from {path} at step {start}": "--resume",
    "the checkpoint has no pre-logits layer: model.vit.pooler is {pooler}": "a checkpoint other than the article's",
    "--resolution {resolution} is not a multiple of the patch size {patch}: the last {rest} pixels of each side fall "
    "outside the patches": "--resolution other than the article's",
    "position table {how} {old}x{old} -> {new}x{new} by the official 2D bilinear rule (scipy.ndimage.zoom, order=1): "
    "{old_rows} -> {new_rows} rows": "--resolution other than the article's (the paper's 384)",
    "{resolution} pixels; batch {batch} = {world} process(es) x {accum} accumulation step(s) x {micro} pictures":
        "torchrun, --accum-steps or another --resolution",
    "paused after step {step} of {steps}; saved {path}: add --resume and a later --pause-at (or none) to continue":
        "--pause-at",
    # vit_backbone.py: the article prints its shapes, the configuration, the two dicts and a figure; the rest of what
    # it computes, and section 5 beyond it, the script prints in lines of its own
    "1. patch tokens to a feature map: (B, N, D) -> (B, H_p, W_p, D) -> (B, D, H_p, W_p)": "a section's title",
    "feature_map[b, :, i, j] == patch_tokens[b, i * W_p + j, :] at {positions that agree} of {places} (b, i, j): each "
    "patch token lands at its own place in the grid": "the feature map checked place by place",
    "grid (4, 5) for 16 patch tokens: {refused}": "the article's refusal of a grid that does not match, shown",
    "2. the table of common ViT configurations, counted on torch's meta device (no download)": "a section's title",
    "model name                     patch input   dim layers heads  table  counted: with its 1000-class head "
    "(backbone alone)": "the article's table, counted: its head row",
    "{name:<30} {patch, input, dim, layers, heads}  {table:>4}M  "
    "{parameters:,} = {parameters (M):.0f}M ({backbone parameters:,} = {backbone parameters (M):.0f}M)  {verdict}":
        "the article's table, counted: a row",
    "same / differs: the table's Parameters column read as the whole classifier its row names (with its 1000-class "
    "head), the number --compare compares. A row is the architecture its name stands for "
    "(vit-<size>-patch<P>-<resolution>), counted, not a released checkpoint: the Hub need not hold one of that exact "
    "name (ViT-B/32 was released as google/vit-base-patch32-224-in21k and -384)": "how the table is read",
    "the table's 86M and 307M are the ViT paper's Table 1 figures for ViT-Base and ViT-Large, given there for every "
    "patch size and resolution; the position table (N+1 rows) and the patch embedding (3 P^2 D) make the counts "
    "differ by patch and resolution": "why the counts differ from the table",
    "3. {model}: backbone + head": "a section's title",
    "{label}: {value}": "the article's print()s of model.config, a line per label (CONFIG_LINES: the article's words)",
    "parameters: backbone (patch embedding, class token, position embedding, encoder, final LayerNorm) "
    "{backbone parameters:,}; head Linear({head in features}, {head out features}) {head parameters:,} "
    "({backbone share (%):.2f}% in the backbone)": "the article's split into backbone and head, counted",
    "one validation picture ({name}, {width}x{height} px) -> pixel_values {pixels.shape} -> Z_L {tokens.shape}":
        "the article's Z_L, on one picture",
    "class token Z_L[:, 0, :] {class_token.shape}; patch tokens Z_L[:, 1:, :] {patch_tokens.shape} -> feature map "
    "{feature_map.shape}":
        "the article's class token and patch tokens, on one picture",
    "the head on the class token, h_cls W + b, gives the model's logits within {head on the class token vs logits:.1e}":
        "the article's logits = h_cls W + b, checked",
    "4. fine-tuning on beans with transformers.Trainer, {not_}as the article: batch {batch}, {epochs} epoch{s}, "
    "learning rate {lr:g}, evaluation every {every} steps": "a section's title, with the article's TrainingArguments",
    "float32: {rule}; TF32 on this device: {tf32}": "how float32 was computed (the article's GPU allowed TF32)",
    "beans: {training pictures:,} training and {validation pictures} validation pictures, {classes} classes "
    "({names})": "the data the run used",
    "seed {seed}: random, numpy and torch, as dnnlpy.set_seed does in its releases 2026.6.11 and 2026.7.21 (2026.8.24 "
    "and later seed torch alone; the article's release is unknown). The shuffles draw from numpy: if the article's "
    "numpy was not seeded, its training order, and so its after numbers, cannot be reproduced by anyone":
        "which generators the article's seed sets",
    "new head Linear({width}, {classes}), random; {training steps} steps ({steps per epoch} per epoch)":
        "the article's new head and steps, counted",
    "({before right} of {pictures} validation pictures right before, {after right} of {pictures} after; training, "
    "with its evaluations every {every} steps, took {training seconds:,.0f} s)": "the two dicts as counts",
    "passes over pictures: the training steps {training}, their pictures decoded and preprocessed by {workers} worker "
    "processes (none on a CPU: the main process); the {evaluations} evaluations {evaluating}, their {pictures} "
    "pictures preprocessed once, before the Trainer, in {validation preprocessing seconds:.1f} s. The Trainer's loop "
    "hides its wait, so every next() of its data loaders is timed from outside (on a CUDA GPU, the GPU's idle time, "
    "with CUDA events)": "the wait for pictures of each pass",
    "step {step:>3}  training loss {training loss:.4f}  eval_loss {eval_loss:.4f}  eval_accuracy {eval_accuracy:.4f}":
        "the article's log_history, which its figure draws",
    "step {step:>3}  training loss {training loss:.4f}": "the article's log_history, which its figure draws",
    "step {step:>3}  eval_loss {eval_loss:.4f}  eval_accuracy {eval_accuracy:.4f}":
        "the article's log_history, which its figure draws",
    "5. beyond the article: three ways to adapt the same backbone, on the same {train:,} training and {val} validation "
    "pictures": "section 5, beyond the article",
    "frozen features: the last layer's class token beside the mean of its patch tokens, {feature width:,} numbers per "
    "picture, {source} in {features seconds:.1f} s (--no-cache recomputes){pass_}": "section 5, beyond the article",
    "linear probe: DINO's linear evaluation (Caron et al. 2021): normal(0, {std}) weights, SGD momentum {momentum}, no "
    "weight decay, learning rate {base_lr} x batch {batch_size}/256, cosine to 0 over {epochs} epochs. Unlike DINO: no "
    "random crops and flips (the features are computed once); the pictures preprocessed as the checkpoint's processor "
    "does (resized to {side}, mean {mean} and std {std}), not Resize 256 + CenterCrop 224 with ImageNet's mean and "
    "std; and the accuracy is the last epoch's, where DINO reports the best over its epochs (chosen on the validation "
    "pictures)":
        "section 5, beyond the article",
    "closed form: Part 3's W = (X^T X + lambda I)^-1 X^T Y on the same features with a bias column, targets in "
    "{{-1, +1}}": "section 5, beyond the article",
    "way                                      accuracy     loss  trained parameters  time (s)":
        "section 5, beyond the article",
    "{way:<40} {accuracy (%):7.2f}%  {loss:>7}  {trained parameters:18,}  {seconds:>8}":
        "section 5, beyond the article",
    "accuracy and loss (cross-entropy) on the validation pictures; the closed form fits squared error to targets in "
    "{{-1, +1}} and gives no probabilities, so it has no cross-entropy; fine-tuning's time is its training with its "
    "evaluations, the probes' their fit on the features": "section 5, beyond the article",
    # vit_part3_setup.py
    "ViT-B/16 from 224 to 384: sequence {s224} -> {s384} = x{sequence 384 over 224:.1f}, pairs per head "
    "x{pairs 384 over 224:.1f}, compute x{compute 384 over 224:.2f}":
        "the prose's \"about 2.9 times longer\" and \"about 8.6 times\" the pairs, computed",
    "the extra {B/16 over B/32 compute above 4:.2f} over x4: the per-token parts grow x{per-token compute ratio:.2f} "
    "({s16}/{s32} tokens; the [class] token keeps it under 4), attention's pairs x{attention compute ratio:.2f}; "
    "attention is {attention share of B/32 (%):.1f}% of ViT-B/32's compute, {attention share of B/16 (%):.1f}% of "
    "ViT-B/16's": "the prose's \"the extra 0.06 comes from attention\", computed",
    "the patch embedding, left out above, costs both {patch embedding GFLOPs:.2f} GFLOPs "
    "({patch embedding share of B/32 (%):.1f}% of ViT-B/32); with it the ratio is "
    "x{B/16 over B/32 compute with the embedding:.2f}":
        "what the compute estimate leaves out (the patch embedding) and what it would change",
    "parameters of the released checkpoints (no head, no pre-logits layer); \"meta device\" = counted from the "
    "Table 1 architecture, the weight file not being cached":
        "the subheader of a run without the weight files: says where its counts come from instead",
    "(picture: {picture}, resized to 224x224)":
        "which picture gave the stage shapes (Imagenette's, or generated noise)",
    "torch BatchNorm (training mode, batch statistics) agrees with both Batch Norm lines: {agrees}":
        "the by-hand Batch Norm checked against torch, as the article's Group Norm line checks GroupNorm",
    "4. pre-training and fine-tuning by hand: Adam, Table 3, SGD with momentum, Polyak averaging, clipping, "
    "Table 4": "section 4's header: the article prints its lines in blocks between its prose, without one",
    # vit_part3_posemb.py
    "3. cosine similarity of position row {place} with its four neighbours and the far corner":
        "section 3: the article gives these similarities in its prose (0.79 to 0.81, -0.29; 0.92 to 0.95)",
    "{grid} grid, row ({r}, {c}): neighbours up {neighbour up:.2f}, down {neighbour down:.2f}, left "
    "{neighbour left:.2f}, right {neighbour right:.2f} ({neighbours min:.2f} to {neighbours max:.2f}); "
    "far corner {corner}: {far corner:.2f}":
        "the prose's neighbour and far-corner similarities, a line per grid, each number named",
    "the loader: {loader}; each row's wait for pictures is its own":
        "how the pictures reach the model (worker processes and their start-up), to read the rows' waits by",
    "zeros: all {zeros rows} rows of E_pos set to 0, the [class] row included; 1D and 2D tables keep the "
    "[class] row as it is": "what each table does with the [class] row, which the article's table leaves unsaid",
    # vit_part3_fewshot.py
    "features {source} in {features seconds:.1f} s ({cache}/; {cache_note}){passes}":
        "where the features came from (the cache or a pass), in how long, and each pass's wait for pictures",
}


def template_of(node):
    """An f-string (or a plain string) as a template: its text, each {expression} a field "{}" (any printed text)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace("{", "{{").replace("}", "}}")
    if not isinstance(node, ast.JoinedStr):
        return None
    return "".join("{}" if isinstance(part, ast.FormattedValue) else part.value.replace("{", "{{").replace("}", "}}")
                   for part in node.values)


def templates(path):
    """[(line number, frame, template or None when the argument is not an f-string)] of a script's report.print
    calls, each template without its frame (FRAMES); an empty line (report.print()) is none."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "print"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "report"):
            template = template_of(node.args[0]) if node.args else ""
            frame = next((call for call, (start, end) in FRAMES.items()
                          if template is not None and template.startswith(start) and template.endswith(end)), None)
            if template is None or frame:
                start, end = FRAMES[frame] if frame else ("", "")
                found.append((node.lineno, frame, template and template[len(start):len(template) - len(end)]))
    return found


def masked(template):
    """A template with each field {name:spec} as {}: the project's own lines are listed with their names."""
    return FIELD.sub(lambda match: match[0] if match[0] in ("{{", "}}") else "{}", template)


OWN = {masked(line) for line in PROJECT_LINES}


def literal_parts(template, frame):
    """The printed line's literal pieces, in order: the template's text between its fields, framed as printed."""
    text = frame.replace("{}", template)
    parts, at = [], 0
    for match in FIELD.finditer(text):
        if match[0] in ("{{", "}}"):
            continue
        parts.append(text[at:match.start()])
        at = match.end()
    parts.append(text[at:])
    return [part.replace("{{", "{").replace("}}", "}") for part in parts]


def matches(parts, line, whole):
    """Does the line hold the pieces in order, any text in each field (the whole line, or within it)? Leftmost
    matching of each piece finds an answer when there is one, in linear time (a regular expression of lazy
    wildcards can take exponential time on the articles' long lines)."""
    if whole and len(parts) == 1:
        return line == parts[0]
    if whole and not line.startswith(parts[0]):
        return False
    at = len(parts[0]) if whole else 0
    for part in parts[1:-1] if whole else parts:
        found = line.find(part, at)
        if found < 0:
            return False
        at = found + len(part)
    return not whole or line.endswith(parts[-1]) and len(line) - len(parts[-1]) >= at


def article_lines(name):
    return (ARTICLES / name).read_text().splitlines()


def all_templates():
    return [(f"{script}:{lineno}", call, template) for script in SCRIPTS
            for lineno, call, template in templates(ROOT / script)]


def test_every_logged_line_is_one_template():
    not_templates = [where for where, _, template in all_templates() if template is None]
    assert not not_templates, f"a logged line built otherwise than from one f-string: {not_templates}"


@pytest.mark.skipif(not ARTICLES.is_dir(), reason="the article is not beside the checkout")
def test_every_template_is_an_article_line_or_the_projects_own():
    """Part 3's logged lines stand alone, indented ("  ", "== ", "-- "): a Part 3 script's template must be one of
    them, whole. The backbone article prints its lines inside its prose: a backbone template must be found there,
    by its own words (10 letters or more, so that a row of fields and spaces is not found in any sentence)."""
    part3 = [line for line in article_lines("vit-explained-part3.txt") if line.startswith(("  ", "== ", "-- "))]
    backbone = article_lines("vit-as-backbone.txt")
    missing, listed_in_article = [], []
    for where, call, template in all_templates():
        if template is None:
            continue
        if where.startswith("vit_part3_"):
            found = any(matches(literal_parts(template, PRINTED[call]), line, True) for line in part3)
        else:
            inline = literal_parts(template, "{}")
            found = sum(len(part.replace(" ", "")) for part in inline) >= 10 and any(matches(inline, line, False)
                                                                                     for line in backbone)
        if not found and template not in OWN:
            missing.append(f"{where}: {template!r}")
        if found and template in OWN:
            listed_in_article.append(f"{where}: {template!r}")
    assert not missing, "templates that are no article line and not listed as the project's own:\n" + "\n".join(
        missing)
    assert not listed_in_article, f"listed as the project's own, but the article prints them: {listed_in_article}"


def test_the_projects_own_lines_are_still_printed():
    used = {template for _, _, template in all_templates()}
    assert not [line for line in PROJECT_LINES if masked(line) not in used], \
        "listed as the project's own but no longer printed"
