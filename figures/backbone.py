"""The backbone article's figures: its own training curves, and the patch tokens' principal components."""
from figures import pyplot, save, stamp

CURVES_FILE, MAPS_FILE = "backbone_curves.png", "backbone_feature_maps.png"


def backbone_curves(series, folder, say, origin=None):
    """backbone: the article's figure, training loss and (a second axis) evaluation accuracy, titled and labelled with
    what it draws and their units; series {name: [[step, y]]} of "training loss" and "evaluation accuracy"."""
    plt = pyplot(say)
    if plt is None:
        return None
    figure = plt.figure(figsize=(6, 4))
    ax1 = figure.add_subplot(1, 1, 1)
    loss, accuracy = series.get("training loss", []), series.get("evaluation accuracy", [])
    line1 = ax1.plot(*zip(*loss, strict=True), color="tab:blue", marker="o", label="Training Loss") if loss else []
    ax1.set(xlabel="Step (optimizer updates)", ylabel="Training Loss (cross-entropy, nats)",
            title="ViT Training Loss and Evaluation Accuracy")
    ax2 = ax1.twinx()
    line2 = ax2.plot(*zip(*accuracy, strict=True), color="tab:orange", marker="o",
                     label="Evaluation Accuracy") if accuracy else []
    ax2.set_ylabel("Evaluation Accuracy (fraction, 0 to 1)", rotation=-90, labelpad=12)
    lines = line1 + line2  # the legend below the axes, where it hides no line (the article's sat on them)
    ax1.legend(lines, [line.get_label() for line in lines], loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2,
               frameon=False)
    stamp(figure, origin)
    return save(figure, folder, CURVES_FILE, say)


def backbone_feature_maps(maps, folder, say, origin=None):
    """backbone: each picture beside its patch tokens' first three principal components as RGB, before and after;
    maps: {"pictures": [h x w x 3 uint8], "before", "after": [H_p x W_p x 3 in [0, 1]], "labels": [name]}."""
    plt = pyplot(say)
    if plt is None:
        return None
    kept = [k for k, label in enumerate(maps["labels"]) if label not in maps["labels"][:k]]
    rows = len(kept)  # the first picture of each class: a class twice says nothing more
    figure, axes = plt.subplots(rows, 3, figsize=(7.5, 2.5 * rows), squeeze=False)
    for row, k in enumerate(kept):
        for axis, image, title in zip(axes[row], (maps["pictures"][k], maps["before"][k], maps["after"][k]),
                                      (maps["labels"][k], "patch tokens before", "after fine-tuning"), strict=True):
            axis.imshow(image, interpolation="nearest")
            axis.set_title(title, fontsize=9)
            axis.axis("off")
    figure.suptitle("patch tokens on their first 3 principal components (RGB), one picture per class")
    stamp(figure, origin)
    return save(figure, folder, MAPS_FILE, say)
