"""Each logged line is one template, and every template is a line of the articles (numbers masked), or listed here
as the project's own with the reason: the layout cannot drift from the articles silently.

The templates are read from the scripts' source: every report.line / header / subheader call, whose first argument
must be a string (or a module constant holding one), not an f-string.
"""
import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.xfail(reason="the scripts' lines are being turned into templates (issue 33)", strict=False)

ROOT = Path(__file__).resolve().parent.parent
ARTICLES = ROOT.parent / "shared" / "article"
SCRIPTS = ("vit_part3_setup.py", "vit_part3_posemb.py", "vit_part3_fewshot.py", "vit_part3_finetune.py",
           "vit_backbone.py")
FRAMES = {"line": "  {}", "header": "== {} ==", "subheader": "-- {} --"}
FIELD = re.compile(r"\{\{|\}\}|\{[^{}]*\}")

# The lines that are the project's own, not the articles': template -> why it is printed.
PROJECT_LINES = {
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
    "(picture: {picture}, resized to 224x224)": "which picture gave the stage shapes (Imagenette's, or generated noise)",
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


def templates(path):
    """[(line number, call, template or None when the first argument is not a string)] of a script's report calls."""
    tree = ast.parse(path.read_text())
    constants = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Name)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FRAMES
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "report"):
            first = node.args[0] if node.args else ast.Constant("")
            if isinstance(first, ast.Name):
                template = constants.get(first.id)
            else:
                template = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
            found.append((node.lineno, node.func.attr, template))
    return found


def masked(template, frame):
    """A regular expression of the printed line: the template's literal text, each field any text."""
    parts, at = [], 0
    for match in FIELD.finditer(template):
        parts.append(re.escape(template[at:match.start()]))
        parts.append(re.escape(match[0][0]) if match[0] in ("{{", "}}") else ".*?")
        at = match.end()
    parts.append(re.escape(template[at:]))
    return re.escape(frame.split("{}")[0]) + "".join(parts) + re.escape(frame.split("{}")[1])


def article_lines():
    return [line for article in sorted(ARTICLES.glob("*.txt")) for line in article.read_text().splitlines()]


def all_templates():
    return [(f"{script}:{lineno}", call, template) for script in SCRIPTS
            for lineno, call, template in templates(ROOT / script)]


def test_every_logged_line_is_one_template():
    not_templates = [where for where, _, template in all_templates() if template is None]
    assert not not_templates, f"a logged line built otherwise than from one string template: {not_templates}"


@pytest.mark.skipif(not ARTICLES.is_dir(), reason="the articles are in ../shared/article, beside the checkout")
def test_every_template_is_an_article_line_or_the_projects_own():
    lines = article_lines()
    part3 = [line for line in lines if line.startswith(("  ", "== ", "-- "))]
    missing, listed_in_article = [], []
    for where, call, template in all_templates():
        if template is None:
            continue
        framed = masked(template, FRAMES[call])
        inline = masked(template, "{}")  # the backbone article prints its lines inside its prose
        found = any(re.fullmatch(framed, line) for line in part3) or any(re.search(inline, line) for line in lines)
        if not found and template not in PROJECT_LINES:
            missing.append(f"{where}: {template!r}")
        if found and template in PROJECT_LINES:
            listed_in_article.append(template)
    assert not missing, "templates that are no article line and not listed as the project's own:\n" + "\n".join(
        missing)
    assert not listed_in_article, f"listed as the project's own, but the article prints them: {listed_in_article}"


def test_the_projects_own_lines_are_still_printed():
    used = {template for _, _, template in all_templates()}
    assert not set(PROJECT_LINES) - used, "listed as the project's own but no longer printed"
