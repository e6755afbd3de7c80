"""posemb's figures: the cosine similarity of position rows, the accuracy of each version of the table."""
from figures import ARTICLE_STYLE, pyplot, save, stamp

COSINE_FILE, ACCURACY_FILE = "posemb_cosine_similarity.png", "posemb_accuracy.png"


def cosine_maps(maps, folder, say, origin=None):
    """posemb: the cosine similarity of one position row with every row, one panel per grid {name: 2D list}; the row
    shown is the one whose similarity with itself is the largest (1), marked and named in the panel's title."""
    plt = pyplot(say)
    if plt is None:
        return None
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(1, len(maps), figsize=(4.5 * len(maps), 4.6), squeeze=False, layout="constrained")
    for axis, (name, similarity) in zip(axes[0], maps.items(), strict=True):
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
    stamp(figure, origin)
    return save(figure, folder, COSINE_FILE, say)


POSEMB_ROWS = ("224", "2D bilinear", "2D bicubic", "1D", "zeros")


def accuracy_rows(values):
    """{row: (of 10, of 1000)} of posemb's section 4, from numbers by name."""
    return {row: (values[f"{row} of 10"], values[f"{row} of 1000"]) for row in POSEMB_ROWS
            if f"{row} of 10" in values and f"{row} of 1000" in values}


def accuracy_bars(values, article, folder, say, origin=None):
    """posemb: accuracy of each version of the table, "of 10" and "of 1000", each bar with its value (0.00 reads as
    zero, not as missing), the article's values marked where there are any; both panels on one accuracy axis."""
    plt = pyplot(say)
    if plt is None:
        return None
    rows, article_rows = accuracy_rows(values), accuracy_rows(article)
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
    labels = list(rows)
    titles = ("of 10 (the Imagenette classes)", "of 1000 (all ImageNet classes)")
    for k, (axis, title) in enumerate(zip(axes, titles, strict=True)):
        bars = axis.bar(range(len(labels)), [rows[label][k] for label in labels], color="tab:blue", label="this run")
        axis.bar_label(bars, fmt="%.2f", padding=2, fontsize=8)
        marked = [i for i, label in enumerate(labels) if label in article_rows]
        if marked:  # none comparable: no empty "article" entry in the legend
            axis.plot(marked, [article_rows[labels[i]][k] for i in marked], **ARTICLE_STYLE)
        axis.set_xticks(range(len(labels)), labels, rotation=20)
        axis.set(title=f"accuracy {title}", xlabel="version of the position table", ylabel="accuracy (%)",
                 ylim=(0, 112))
        axis.legend(loc="upper right", fontsize=8)
    stamp(figure, origin)
    return save(figure, folder, ACCURACY_FILE, say)
