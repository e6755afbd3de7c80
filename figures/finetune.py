"""fine-tuning's figure: loss, gradient norm, learning rate and validation accuracy against step."""
import re

from figures import ARTICLE_STYLE, pyplot, save, stamp

FILE = "finetune_curves.png"


def logged_steps(values):
    """{"lr" | "loss" | "norm" | "accuracy": {step: value}} of the fine-tuning's logged steps, by name, step 0's
    accuracy ("step 0 validation") first."""
    steps = {"accuracy": {0: values["step 0 validation"]}} if "step 0 validation" in values else {}
    for name, value in values.items():
        found = re.fullmatch(r"step (\d+) (lr|loss|norm|accuracy)", name)
        if found:
            steps.setdefault(found[2], {})[int(found[1])] = value
    return steps


FINETUNE_PANELS = (("training loss", "loss", "cross-entropy (nats)"),
                   ("gradient norm", "norm", "L2 norm, before clipping"),
                   ("learning rate", "lr", "learning rate (per unit of gradient)"),
                   ("validation accuracy", "accuracy", "accuracy (%)"))


def finetune_curves(series, values, article, folder, say, origin=None):
    """fine-tuning: loss, gradient norm, LR and validation accuracy against the run's steps, the article's marked up to
    its last; series: a value per step from 1 (else the logged steps') and the "clipping threshold"."""
    plt = pyplot(say)
    if plt is None:
        return None
    from matplotlib.ticker import MaxNLocator

    logged, marks = logged_steps(values), logged_steps(article)
    curves = {key: dict(enumerate(series[name], 1)) if series.get(name) else logged.get(key, {})
              for name, key, _ in FINETUNE_PANELS}
    last = max([step for curve in curves.values() for step in curve] or [1])
    figure, axes = plt.subplots(2, 2, figsize=(9, 6.5), layout="constrained")  # readable at a page's width
    margin = max(0.5, 0.02 * last)
    for axis, (name, key, unit) in zip(axes.flat, FINETUNE_PANELS, strict=True):
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
    entries = {}  # one legend for the four panels, below them, where it hides no point
    for axis in axes.flat:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    figure.legend(list(entries.values()), list(entries), loc="outside lower center", ncol=len(entries))
    stamp(figure, origin)
    return save(figure, folder, FILE, say)
