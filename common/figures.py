"""Figures are optional: matplotlib when installed, one line saying how to get it when not."""
from pathlib import Path

INSTALL_HINT = "matplotlib is not installed (pip install matplotlib)"


def pyplot(say):
    """matplotlib.pyplot with a file-only backend, or None after say()ing how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say(f"--plots: {INSTALL_HINT}; no figure saved")
        return None
    return plt


def save(figure, plots_dir, name, say):
    """Save the figure as plots_dir/name and say where."""
    import matplotlib.pyplot as plt

    Path(plots_dir).mkdir(parents=True, exist_ok=True)
    path = Path(plots_dir) / name
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    say(f"saved {path}")
    return path
