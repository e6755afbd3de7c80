"""What the figures share (a module per script): each is drawn from what a run keeps in its --json, so that
job/page.py draws the same one; without matplotlib, one line says so."""
from pathlib import Path

from common.errors import UserError
from common.files import write_atomic
from common.output import MATPLOTLIB_MISSING as INSTALL_HINT

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
