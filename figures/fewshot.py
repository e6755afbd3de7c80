"""few-shot's figure: accuracy against shots, a line per lambda, a panel per representation."""
import re

from figures import ARTICLE_STYLE, pyplot, save

FILE = "fewshot_accuracy.png"


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


def fewshot_accuracy(values, article, folder, say):
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
    return save(figure, folder, FILE, say)
