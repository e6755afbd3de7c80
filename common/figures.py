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
    """posemb: the cosine similarity of one position row with every row, one panel per grid {name: 2D list}; the row
    shown is the one whose similarity with itself is the largest (1), marked and named in the panel's title."""
    plt = pyplot(say)
    if plt is None:
        return None
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(1, len(maps), figsize=(4.5 * len(maps), 4.6), squeeze=False, layout="constrained")
    for axis, (name, similarity) in zip(axes[0], maps.items()):
        grid = np.asarray(similarity, dtype=float)
        row, column = np.unravel_index(np.argmax(grid), grid.shape)
        image = axis.imshow(grid, cmap="viridis", vmin=-1, vmax=1)
        axis.plot(column, row, marker="+", color="red", markersize=12, markeredgewidth=2, linestyle="none")
        axis.set_title(f"{name} grid: the row of position ({row}, {column}) (+)\nagainst every position's row",
                       fontsize=10)
        axis.set(xlabel="grid column (patch position)", ylabel="grid row (patch position)")
        for ticks in (axis.xaxis, axis.yaxis):
            ticks.set_major_locator(MaxNLocator(integer=True))
    figure.colorbar(image, ax=list(axes[0]), shrink=0.8, label="cosine similarity")
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
    """posemb: accuracy of each version of the table, "of 10" and "of 1000", each bar with its value (0.00 reads as
    zero, not as missing), the article's values marked."""
    plt = pyplot(say)
    if plt is None:
        return None
    rows, article_rows = accuracy_rows(values), accuracy_rows(article)
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    labels = list(rows)
    for k, (axis, title) in enumerate(zip(axes, ("of 10 (the Imagenette classes)", "of 1000 (all ImageNet classes)"))):
        bars = axis.bar(range(len(labels)), [rows[label][k] for label in labels], color="tab:blue", label="this run")
        axis.bar_label(bars, fmt="%.2f", padding=2, fontsize=8)
        marked = [i for i, label in enumerate(labels) if label in article_rows]
        axis.plot(marked, [article_rows[labels[i]][k] for i in marked], **ARTICLE_STYLE)
        axis.set_xticks(range(len(labels)), labels, rotation=20)
        axis.set(title=f"accuracy {title}", xlabel="version of the position table", ylabel="accuracy (%)",
                 ylim=(0, 112))
        axis.legend(loc="upper right", fontsize=8)
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
        axis.set(title=f"few-shot accuracy, {representation}", xlabel="training pictures per class (shots)",
                 ylabel="accuracy (%)")
        axis.set_xticks(sorted({cell["shots"] for cell in cells} | {shots for shots, _ in marks}))
        axis.legend()
    return save(figure, path, say)


FINETUNE_PANELS = (("training loss", "loss", "cross-entropy (nats)"), ("gradient norm", "norm", "L2 norm, before clipping"),
                   ("learning rate", "lr", "learning rate"), ("validation accuracy", "accuracy", "accuracy (%)"))


def finetune_curves(series, values, article, path, say):
    """fine-tuning: loss, gradient norm (with the clipping threshold), LR and validation accuracy against step, on the
    run's own steps: the article's logged steps are marked only up to this run's last step.

    series: {"training loss", "gradient norm", "learning rate"}: one value per step from 1, and the recipe's
    "clipping threshold"; the
    validation accuracy and the article's marks come from the logged steps' numbers, and so do the
    other panels' points where a run keeps no series (one paused before its end).
    """
    plt = pyplot(say)
    if plt is None:
        return None
    from matplotlib.ticker import MaxNLocator

    logged, marks = logged_steps(values), logged_steps(article)
    if "step 0 validation" in article:
        marks.setdefault("accuracy", {})[0] = article["step 0 validation"]
    curves = {key: dict(enumerate(series[name], 1)) if series.get(name) else logged.get(key, {})
              for name, key, _ in FINETUNE_PANELS[:3]}
    curves["accuracy"] = {**({0: values["step 0 validation"]} if "step 0 validation" in values else {}),
                          **logged.get("accuracy", {})}
    last = max([step for curve in curves.values() for step in curve] or [1])
    figure, axes = plt.subplots(1, 4, figsize=(20, 4), layout="constrained")
    margin = max(0.5, 0.02 * last)
    for axis, (name, key, unit) in zip(axes, FINETUNE_PANELS):
        curve = curves[key]
        style = "o-" if len(curve) <= 30 else "-"  # a short run's every point is seen
        axis.plot(list(curve), list(curve.values()), style, markersize=3, label="this run")
        shown = {step: value for step, value in marks.get(key, {}).items() if step <= last}
        if shown:
            axis.plot(list(shown), list(shown.values()), **ARTICLE_STYLE)
        if key == "norm" and "clipping threshold" in series:
            clip = series["clipping threshold"]
            axis.axhline(clip, color="tab:red", linestyle="--", label=f"clipping at {clip:g}")
        axis.set(title=name, xlabel="step (optimizer updates)", ylabel=unit, xlim=(-margin, last + margin))
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.legend(fontsize=8)
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
    lines = line1 + line2  # the legend below the axes, where it hides no line (the article's sat on them)
    ax1.legend(lines, [line.get_label() for line in lines], loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2,
               frameon=False)
    return save(figure, path, say)


def backbone_feature_maps(maps, path, say):
    """backbone: each picture beside its patch tokens' first three principal components as RGB, before and after.

    maps: {"pictures": [h x w x 3 uint8], "before", "after": [H_p x W_p x 3 in [0, 1]], "labels": [name]}.
    """
    plt = pyplot(say)
    if plt is None:
        return None
    kept = [k for k, label in enumerate(maps["labels"]) if label not in maps["labels"][:k]]
    rows = len(kept)  # the first picture of each class: a class twice says nothing more
    figure, axes = plt.subplots(rows, 3, figsize=(7.5, 2.5 * rows), squeeze=False)
    for row, k in enumerate(kept):
        for axis, image, title in zip(axes[row], (maps["pictures"][k], maps["before"][k], maps["after"][k]),
                                      (maps["labels"][k], "patch tokens before", "after fine-tuning")):
            axis.imshow(image, interpolation="nearest")
            axis.set_title(title, fontsize=9)
            axis.axis("off")
    figure.suptitle("patch tokens on their first 3 principal components (RGB), one picture per class")
    return save(figure, path, say)
