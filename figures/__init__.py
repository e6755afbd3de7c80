"""What the figures share (a module per script): each is drawn from what a run keeps in its --json, so that
job/page.py draws the same one; without matplotlib, one line says so."""
from pathlib import Path

from common.files import write_atomic
from common.start_and_end import MATPLOTLIB_MISSING as INSTALL_HINT
from common.start_and_end import UserError
from compare.marks import made_here

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


def provenance(model, data, made=None):
    """The line each figure carries: the checkpoint and the data it shows, and, for a stand-in or the miniature (its
    mark, or made: what job/ made of them), that its numbers are not the article's."""
    folders = [path for path in (model, data) if path and Path(path).expanduser().is_dir()]
    made = made or next(filter(None, map(made_here, folders)), None)
    return f"model: {model}; data: {data}" + (f"; {made}: its numbers are not the article's" if made else "")


def origin_of(args, default_data):
    """provenance() of a script's run: its --model and --data-dir (default_data: the copy it reads without one)."""
    return provenance(getattr(args, "model", None), getattr(args, "data_dir", None) or default_data)


def stamp(figure, origin):
    """The figure's provenance line (provenance()), small, over its highest part: a PNG copied out of the page still
    says what it shows (under it, savefig's tight crop moved a legend below the axes onto it)."""
    if origin:
        figure.draw_without_rendering()  # its layout made, so that its highest part is known
        highest = (figure.get_tightbbox().y1 + 3 / 72) / figure.get_figheight()  # 3 points over it, as a fraction
        figure.text(0.5, max(1.0, highest), origin, ha="center", va="bottom", fontsize=7, color="dimgray")


def save(figure, folder, name, say):
    """Save the figure as the PNG folder/name (whole or not at all) and say where; its path, or None after one
    `warning:` line naming the file and why when it cannot be written: a figure is a convenience (job/page.py redraws
    it from the --json record), so the section that draws it, its numbers and the exit status stay as they are."""
    import matplotlib.pyplot as plt

    path = Path(folder) / name
    try:
        write_atomic(path, lambda f: figure.savefig(f, format="png", dpi=100, bbox_inches="tight"), what="figure")
    except UserError as error:
        say(f"warning: {error}")
        return None
    finally:
        plt.close(figure)
    say(f"saved {path}")
    return path
