"""few-shot's figure: accuracy against shots, a line per lambda, a panel per representation."""
import itertools
import math
import re

from figures import pyplot, save, stamp

FILE = "fewshot_accuracy.png"
ARTICLE_MARKERS = ("x", "+", "*", "X", "P", "1")  # the article's points: a marker of its own per lambda


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


def error_bars(draws, article):
    """What a point and its bar are (the script's table: np.mean and np.std, ddof 0, of the draws' accuracies)."""
    over = f"{draws} random draws" if draws else "the random draws"
    return (f"point: mean accuracy over {over} of the training pictures;\n"
            "bar: ± 1 standard deviation over the draws "
            f"(ddof 0{'; the article: over its 5 draws' if article else ''})")


def fewshot_accuracy(values, article, folder, say, draws=None, origin=None):
    """few-shot: accuracy against shots, a line per lambda and the article's points, a colour and (the article's) a
    marker of its own per lambda, a panel per representation; the mean over the draws +- their std as bars (draws: how
    many, when known). Each lambda's points sit a little apart along the (log) x axis, the article's beside the
    run's, so that equal ones stay seen; the ticks are the shots."""
    plt = pyplot(say)
    if plt is None:
        return None
    from matplotlib.ticker import NullLocator

    cells, article_cells = fewshot_cells(values), fewshot_cells(article)
    representations = sorted({cell["representation"] for cell in cells}, reverse=True)
    lambdas = sorted({cell["lambda"] for cell in cells + article_cells})
    shots = sorted({cell["shots"] for cell in cells + article_cells})
    decades = [math.log10(n) for n in shots]  # shots on a log axis: 1, 2, 5 and 10 apart
    steps = [b - a for a, b in itertools.pairwise(decades)]
    gap = min([0.015 * max(decades[-1] - decades[0], 1)] + [step / (2 * len(lambdas) + 1) for step in steps])
    figure, axes = plt.subplots(1, len(representations), figsize=(5.5 * len(representations), 4.2), squeeze=False,
                                layout="constrained", sharey=True)  # the representations compared on one axis
    for axis, representation in zip(axes[0], representations, strict=True):
        for k, lam in enumerate(lambdas):
            offset = (2 * k - len(lambdas) + 0.5) * gap  # in decades: the run's point, the article's a gap right
            for source, kept, style in (("this run", cells, {"marker": "o", "linestyle": "-", "markersize": 5}),
                                        ("article", article_cells, {"marker": ARTICLE_MARKERS[k % len(ARTICLE_MARKERS)],
                                                                    "linestyle": "none", "markersize": 9})):
                points = sorted((c["shots"], c["mean"], c["std"]) for c in kept
                                if c["representation"] == representation and c["lambda"] == lam)
                if points:
                    x, mean, std = zip(*points, strict=True)
                    shift = offset + (gap if source == "article" else 0)
                    axis.errorbar([s * 10 ** shift for s in x], mean, std, capsize=3, color=f"C{k}",
                                  label=f"lambda {lam:g}, {source}", **style)
        axis.set(title=f"few-shot accuracy, {representation}", xlabel="training pictures per class (shots)",
                 ylabel="accuracy (%)")
        axis.set_xscale("log")
        axis.set_xticks(shots, [str(n) for n in shots])
        axis.xaxis.set_minor_locator(NullLocator())
    handles = {}  # one entry per label across the panels, in lambda order
    for axis in axes[0]:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    order = sorted(handles, key=lambda label: (float(label.split()[1].rstrip(",")), "article" in label))
    figure.legend([handles[label] for label in order], order, loc="outside lower center", ncol=len(lambdas),
                  fontsize=8, title=error_bars(draws, article_cells), title_fontsize=8)
    stamp(figure, origin)
    return save(figure, folder, FILE, say)
