"""What the figures share (a module per script): each is drawn from what a run keeps in its --json, so that
job/page.py draws the same one; without matplotlib, one line says so."""
from pathlib import Path

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
    """Save the figure as the PNG folder/name (whole or not at all) and say where; UserError when it cannot be written."""
    import matplotlib.pyplot as plt

    path = Path(folder) / name
    try:
        write_atomic(path, lambda f: figure.savefig(f, format="png", dpi=100, bbox_inches="tight"), what="figure")
    finally:
        plt.close(figure)
    say(f"saved {path}")
    return path
