"""The figures of the scripts' --plots and of the reproduction report; without matplotlib, one line says so.

Each function draws from plain data (what a run keeps in its --json "series" and numbers), so a
script draws its figure at the end of a run and job/page.py draws the same one from the JSON.
"""
import re
from pathlib import Path

from common.files import write_atomic
from common.run import MATPLOTLIB_MISSING as INSTALL_HINT

ARTICLE_STYLE = {"marker": "x", "color": "black", "linestyle": "none", "markersize": 8, "label": "article"}


def pyplot(say):
    """matplotlib.pyplot with a file-only backend, or None after say()ing how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say(f"figures: {INSTALL_HINT}; no figure saved")
        return None
    return plt


def save(figure, path, say):
    """Save the figure as a PNG at path (whole or not at all) and say where; UserError when it cannot be written."""
    import matplotlib.pyplot as plt

    try:
        write_atomic(path, lambda f: figure.savefig(f, format="png", dpi=100, bbox_inches="tight"), what="figure")
    finally:
        plt.close(figure)
    say(f"saved {path}")
    return Path(path)


def cosine_maps(maps, path, say):
    """posemb: the cosine similarity of one position row with every row, one panel per grid {name: 2D list}."""
    plt = pyplot(say)
    if plt is None:
        return None
    figure, axes = plt.subplots(1, len(maps), figsize=(4 * len(maps), 4), squeeze=False)
    for axis, (name, similarity) in zip(axes[0], maps.items()):
        image = axis.imshow(similarity, cmap="viridis", vmin=-1, vmax=1)
        axis.set_title(f"cosine similarity, {name} grid")
    figure.colorbar(image, ax=list(axes[0]), shrink=0.8)
    return save(figure, path, say)


POSEMB_ROWS = ("224", "2D bilinear", "2D bicubic", "1D", "zeros")


def accuracy_rows(values):
    """{row: (of 10, of 1000)} of posemb's section 4, from numbers by name."""
    return {row: (values[f"{row} of 10"], values[f"{row} of 1000"]) for row in POSEMB_ROWS
            if f"{row} of 10" in values and f"{row} of 1000" in values}


def fewshot_cells(values):
    """[{"representation", "lambda", "shots", "mean", "std"}] of the few-shot table, from numbers by name."""
    cells = []
    for name, mean in values.items():
        found = re.fullmatch(r"(pre-logits|class token) lambda (\S+) (\d+)-shot mean", name)
        if found:
            std = values.get(name[:-len("mean")] + "std", 0.0)
            cells.append({"representation": found[1], "lambda": float(found[2]), "shots": int(found[3]),
                          "mean": mean, "std": std})
    return cells


def logged_steps(values):
    """{"lr" | "loss" | "norm" | "accuracy": {step: value}} of the fine-tuning's logged steps, by name."""
    steps = {}
    for name, value in values.items():
        found = re.fullmatch(r"step (\d+) (lr|loss|norm|accuracy)", name)
        if found:
            steps.setdefault(found[2], {})[int(found[1])] = value
    return steps


def accuracy_bars(values, article, path, say):
    """posemb: accuracy of each version of the table, "of 10" and "of 1000", the article's values marked."""
    plt = pyplot(say)
    if plt is None:
        return None
    rows, article_rows = accuracy_rows(values), accuracy_rows(article)
    figure, axes = plt.subplots(1, 2, figsize=(12, 4))
    labels = list(rows)
    for k, (axis, title) in enumerate(zip(axes, ("of 10 (the Imagenette classes)", "of 1000 (all ImageNet classes)"))):
        axis.bar(range(len(labels)), [rows[label][k] for label in labels], color="tab:blue", label="this run")
        marked = [i for i, label in enumerate(labels) if label in article_rows]
        axis.plot(marked, [article_rows[labels[i]][k] for i in marked], **ARTICLE_STYLE)
        axis.set_xticks(range(len(labels)), labels, rotation=20)
        axis.set(title=f"accuracy {title}", ylabel="%", ylim=(0, 105))
        axis.legend()
    return save(figure, path, say)


def fewshot_accuracy(values, article, path, say):
    """few-shot: accuracy against shots, one line per lambda, a panel per representation; std over draws as bars."""
    plt = pyplot(say)
    if plt is None:
        return None
    cells, article_cells = fewshot_cells(values), fewshot_cells(article)
    representations = sorted({cell["representation"] for cell in cells}, reverse=True)
    figure, axes = plt.subplots(1, len(representations), figsize=(6 * len(representations), 4), squeeze=False)
    for axis, representation in zip(axes[0], representations):
        for lam in sorted({cell["lambda"] for cell in cells if cell["representation"] == representation}):
            points = sorted((c["shots"], c["mean"], c["std"]) for c in cells
                            if c["representation"] == representation and c["lambda"] == lam)
            axis.errorbar(*zip(*points), capsize=3, marker="o", label=f"lambda {lam:g}")
        marks = [(c["shots"], c["mean"]) for c in article_cells if c["representation"] == representation]
        if marks:
            axis.plot(*zip(*marks), **ARTICLE_STYLE)
        axis.set(title=f"few-shot accuracy, {representation}", xlabel="pictures per class", ylabel="%")
        axis.legend()
    return save(figure, path, say)


def finetune_curves(series, values, article, clip_norm, path, say):
    """fine-tuning: loss, gradient norm (with the clipping threshold), LR and validation accuracy against step.

    series: {"training loss", "gradient norm", "learning rate"}: one value per step from 1; the
    validation accuracy and the article's marks come from the logged steps' numbers, and so do the
    other panels' points where a run keeps no series (one paused before its end).
    """
    plt = pyplot(say)
    if plt is None:
        return None
    figure, axes = plt.subplots(1, 4, figsize=(20, 4))
    logged = logged_steps(values)
    for axis, name, key in zip(axes, ("training loss", "gradient norm", "learning rate"), ("loss", "norm", "lr")):
        curve = series.get(name)
        if curve:
            axis.plot(range(1, len(curve) + 1), curve, label="this run")
        else:
            axis.plot(list(logged.get(key, {})), list(logged.get(key, {}).values()), "o-", label="this run")
        axis.set(title=name, xlabel="step")
    axes[1].axhline(clip_norm, color="tab:red", linestyle="--", label=f"clipping at {clip_norm:g}")
    accuracy = {0: values["step 0 validation"]} if "step 0 validation" in values else {}
    accuracy.update(logged.get("accuracy", {}))
    axes[3].plot(list(accuracy), list(accuracy.values()), "o-", label="this run")
    axes[3].set(title="validation accuracy (%)", xlabel="step")
    marks = logged_steps(article)
    for axis, key in zip(axes, ("loss", "norm", "lr", "accuracy")):
        if marks.get(key):
            axis.plot(list(marks[key]), list(marks[key].values()), **ARTICLE_STYLE)
        axis.legend()
    return save(figure, path, say)


def backbone_curves(series, path, say):
    """backbone: the article's figure, the training loss and (on a second axis) the evaluation accuracy against step.

    series: {"training loss": [[step, loss]], "evaluation accuracy": [[step, accuracy]]}.
    """
    plt = pyplot(say)
    if plt is None:
        return None
    figure = plt.figure(figsize=(6, 4))
    ax1 = figure.add_subplot(1, 1, 1)
    loss, accuracy = series.get("training loss", []), series.get("evaluation accuracy", [])
    line1 = ax1.plot(*zip(*loss), color="tab:blue", marker="o", label="Training Loss") if loss else []
    ax1.set(xlabel="Step", ylabel="Training Loss", title="ViT Training Loss Curve")
    ax2 = ax1.twinx()
    line2 = ax2.plot(*zip(*accuracy), color="tab:orange", marker="o", label="Evaluation Accuracy") if accuracy else []
    ax2.set_ylabel("Evaluation Accuracy", rotation=-90, labelpad=12)
    lines = line1 + line2
    ax1.legend(lines, [line.get_label() for line in lines], loc="center right")
    return save(figure, path, say)


def backbone_feature_maps(maps, path, say):
    """backbone: each picture beside its patch tokens' first three principal components as RGB, before and after.

    maps: {"pictures": [h x w x 3 uint8], "before", "after": [H_p x W_p x 3 in [0, 1]], "labels": [name]}.
    """
    plt = pyplot(say)
    if plt is None:
        return None
    rows = len(maps["pictures"])
    figure, axes = plt.subplots(rows, 3, figsize=(7.5, 2.5 * rows), squeeze=False)
    for row in range(rows):
        for axis, image, title in zip(axes[row], (maps["pictures"][row], maps["before"][row], maps["after"][row]),
                                      (maps["labels"][row], "patch tokens before", "after fine-tuning")):
            axis.imshow(image, interpolation="nearest")
            axis.set_title(title, fontsize=9)
            axis.axis("off")
    figure.suptitle("patch tokens on their first 3 principal components (RGB)")
    return save(figure, path, say)
