"""figures/: figures a reader understands without the code: axes titled, a short run on its own steps, zero
drawn as zero, the cosine grids' position named, one picture per class. Each figure is caught before it is saved."""
import pytest

from figures import backbone, finetune, posemb

pytest.importorskip("matplotlib")


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """{file name: the matplotlib figure} of what the functions save."""
    caught = {}
    def save(figure, folder, name, say):
        caught[name] = figure
        return folder / name

    for module in (backbone, finetune, posemb):
        monkeypatch.setattr(module, "save", save)
    return caught


def titled(axis):
    return axis.get_xlabel().strip() and axis.get_ylabel().strip()


def test_a_six_step_fine_tuning_is_drawn_on_its_own_steps_with_the_articles_points_it_reached(drawn, tmp_path):
    series = {"training loss": [2.3, 2.2, 2.1, 2.0, 1.9, 1.8], "gradient norm": [1.5] * 6,
              "learning rate": [0.0, 0.003, 0.0027, 0.002, 0.001, 0.0003], "clipping threshold": 1.0}
    values = {"step 0 validation": 10.0, "step 5 accuracy": 20.0, "step 6 accuracy": 20.0}
    article = {"step 0 validation": 10.0, "step 5 loss": 2.3014, "step 50 loss": 1.68, "step 300 loss": 0.30,
               "step 5 accuracy": 98.3, "step 300 accuracy": 99.7}
    finetune.finetune_curves(series, values, article, tmp_path, print)
    axes = drawn["finetune_curves.png"].axes
    assert len(axes) == 4 and all(titled(axis) for axis in axes)
    for axis in axes:
        assert axis.get_xlim()[1] < 10  # not the article's 300 steps
        for line in axis.get_lines():
            if line.get_label() == "article":
                assert max(line.get_xdata()) <= 6
    loss_marks = next(line for line in axes[0].get_lines() if line.get_label() == "article")
    assert list(loss_marks.get_xdata()) == [5] and list(loss_marks.get_ydata()) == [2.3014]
    accuracy_marks = next(line for line in axes[3].get_lines() if line.get_label() == "article")
    assert sorted(accuracy_marks.get_xdata()) == [0, 5]
    accuracy = next(line for line in axes[3].get_lines() if line.get_label() == "this run")
    assert list(accuracy.get_xdata()) == [0, 5, 6] and list(accuracy.get_ydata()) == [10.0, 20.0, 20.0]


def test_a_zero_accuracy_bar_carries_its_value(drawn, tmp_path):
    values = {f"{row} of {n}": 0.0 for row in posemb.POSEMB_ROWS for n in (10, 1000)}
    values["zeros of 10"] = 10.0
    posemb.accuracy_bars(values, {}, tmp_path, print)
    axes = drawn["posemb_accuracy.png"].axes
    assert all(titled(axis) for axis in axes)
    labels = [text.get_text() for text in axes[0].texts]
    assert labels == ["0.00", "0.00", "0.00", "0.00", "10.00"]
    assert [text.get_text() for text in axes[1].texts] == ["0.00"] * 5


def test_the_cosine_grids_name_the_position_shown_and_have_grid_positions_on_their_axes(drawn, tmp_path):
    grid = [[0.1, 0.2, 0.3], [0.0, 0.5, 0.4], [0.2, 1.0, -0.3]]  # position (2, 1) is the row itself
    posemb.cosine_maps({"3x3": grid}, tmp_path, print)
    axis = drawn[posemb.COSINE_FILE].axes[0]
    assert "(2, 1)" in axis.get_title() and titled(axis)
    for ticks in (axis.get_xticks(), axis.get_yticks()):
        shown = [tick for tick in ticks if -0.5 <= tick <= 2.5]
        assert shown and all(float(tick).is_integer() for tick in shown), ticks
    assert drawn[posemb.COSINE_FILE].axes[1].get_ylabel() == "cosine similarity"  # the colour bar


def test_the_feature_maps_show_each_class_once(drawn, tmp_path):
    picture, tokens = [[[0, 0, 0]] * 2] * 2, [[[0.5] * 3] * 2] * 2
    maps = {"pictures": [picture] * 4, "before": [tokens] * 4, "after": [tokens] * 4,
            "labels": ["angular_leaf_spot", "bean_rust", "healthy", "angular_leaf_spot"]}
    backbone.backbone_feature_maps(maps, tmp_path, print)
    titles = [axis.get_title() for axis in drawn[backbone.MAPS_FILE].axes[::3]]
    assert titles == ["angular_leaf_spot", "bean_rust", "healthy"]


def test_the_backbone_curves_keep_the_articles_figure_with_the_legend_off_the_lines(drawn, tmp_path):
    series = {"training loss": [[10, 1.1], [20, 0.5], [30, 0.2]], "evaluation accuracy": [[10, 0.6], [30, 0.98]]}
    figure = backbone.backbone_curves(series, tmp_path, print) and drawn[backbone.CURVES_FILE]
    axis = figure.axes[0]
    assert axis.get_title() == "ViT Training Loss Curve" and len(figure.axes) == 2  # the article's twin axes
    figure.canvas.draw()
    legend, plotted = axis.get_legend().get_window_extent(), axis.get_window_extent()
    assert legend.y1 <= plotted.y0 or legend.x0 >= plotted.x1  # outside the axes: over no line
