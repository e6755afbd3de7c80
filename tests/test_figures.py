"""figures/: figures a reader understands without the code: axes titled, a short run on its own steps, zero
drawn as zero, the cosine grids' position named, one picture per class, points no legend hides, each lambda's points
told apart, the error bars named, compared panels on one axis, no empty legend entry, and each figure's line naming
the model and data it shows. Each figure is caught before it is saved."""
import io
import json

import pytest
from conftest import script_output

import vit_part3_finetune
from figures import backbone, fewshot, finetune, posemb
from job import page as page_maker

pytest.importorskip("matplotlib")


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """{file name: the matplotlib figure} of what the functions save."""
    caught = {}
    def save(figure, folder, name, say):
        caught[name] = figure
        return folder / name

    for module in (backbone, fewshot, finetune, posemb):
        monkeypatch.setattr(module, "save", save)
    return caught


def titled(axis):
    return axis.get_xlabel().strip() and axis.get_ylabel().strip()


def points_under(legend, figure):
    """The data points (of lines and error bars' points) that the legend, drawn, covers, in pixels."""
    figure.canvas.draw()
    box = legend.get_window_extent()
    covered = []
    for axis in figure.axes:
        for line in axis.get_lines():
            for x, y in axis.transData.transform(line.get_xydata()):
                if box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1:
                    covered.append((axis.get_title(), line.get_label(), x, y))
    return covered


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
    # no row comparable with the article's: no empty "article" entry; both panels on one accuracy axis
    assert [[text.get_text() for text in axis.get_legend().get_texts()] for axis in axes] == [["this run"]] * 2
    assert axes[0].get_shared_y_axes().joined(axes[0], axes[1])


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
    assert axis.get_title() == "ViT Training Loss and Evaluation Accuracy" and len(figure.axes) == 2  # twin axes
    assert [axis.get_ylabel() for axis in figure.axes] == ["Training Loss (cross-entropy, nats)",
                                                           "Evaluation Accuracy (fraction, 0 to 1)"]
    figure.canvas.draw()
    legend, plotted = axis.get_legend().get_window_extent(), axis.get_window_extent()
    assert legend.y1 <= plotted.y0 or legend.x0 >= plotted.x1  # outside the axes: over no line


def test_the_fine_tuning_panels_are_a_grid_readable_at_a_pages_width_with_one_legend_over_no_point(drawn, tmp_path):
    series = {"training loss": [2.3, 2.2, 2.1, 2.0, 1.9, 1.8], "gradient norm": [1.5] * 6,
              "learning rate": [0.0, 0.003, 0.0027, 0.002, 0.001, 0.0003], "clipping threshold": 1.0}
    values = {"step 0 validation": 10.0, "step 5 accuracy": 97.0, "step 6 accuracy": 99.0}
    article = {"step 5 loss": 2.3014, "step 5 accuracy": 98.3}  # step 5's points: high in their panels
    finetune.finetune_curves(series, values, article, tmp_path, print)
    figure = drawn[finetune.FILE]
    width, height = figure.get_size_inches()
    assert width / height <= 2 and width * 100 <= 1000  # saved at 100 dpi: no wider than a page
    assert [axis.get_subplotspec().get_geometry()[:2] for axis in figure.axes] == [(2, 2)] * 4
    assert all(axis.get_legend() is None for axis in figure.axes) and len(figure.legends) == 1
    legend = figure.legends[0]
    assert [text.get_text() for text in legend.get_texts()] == ["this run", "article", "clipping at 1"]
    assert points_under(legend, figure) == []
    box = legend.get_window_extent()  # nor on a panel, its title or its axes' labels
    assert not any(box.overlaps(axis.get_tightbbox()) for axis in figure.axes)


FEWSHOT_RUN = {f"{representation} lambda {lam} {shots}-shot {what}": value
               for representation in ("pre-logits", "class token") for lam in ("0.01", "1", "100")
               for shots in (1, 2) for what, value in (("mean", 50.0), ("std", 2.0))}
FEWSHOT_ARTICLE = {f"pre-logits lambda {lam} 1-shot {what}": value
                   for lam in ("0.01", "1", "100") for what, value in (("mean", 98.0), ("std", 0.6))}


def test_each_lambda_of_the_few_shot_figure_has_its_own_points_and_legend_entries_and_the_bars_are_named(
        drawn, tmp_path):
    """Every lambda at 50 +- 2 (the article's at 98.0 +- 0.6): six points at each shot, none hidden by another."""
    fewshot.fewshot_accuracy(FEWSHOT_RUN, FEWSHOT_ARTICLE, tmp_path, print, draws=5)
    figure = drawn[fewshot.FILE]
    assert len(figure.legends) == 1 and all(axis.get_legend() is None for axis in figure.axes)
    legend = figure.legends[0]
    assert [text.get_text() for text in legend.get_texts()] == [
        "lambda 0.01, this run", "lambda 0.01, article", "lambda 1, this run", "lambda 1, article",
        "lambda 100, this run", "lambda 100, article"]
    title = legend.get_title().get_text()
    assert "mean accuracy over 5 random draws" in title and "± 1 standard deviation over the draws" in title
    assert "the article: over its 5 draws" in title
    assert points_under(legend, figure) == []
    assert not any(legend.get_window_extent().overlaps(axis.get_tightbbox()) for axis in figure.axes)
    pre_logits = figure.axes[0]
    assert pre_logits.get_title() == "few-shot accuracy, pre-logits"
    assert pre_logits.get_shared_y_axes().joined(pre_logits, figure.axes[1])  # the representations on one axis
    marks = {}
    for container in pre_logits.containers:
        label = container.get_label()
        line, _, (bars,) = container
        marks[label] = line.get_xdata()
        for (x, y), segment in zip(line.get_xydata(), bars.get_segments(), strict=True):
            spread = 0.6 if label.endswith("article") else 2.0
            assert segment[0][0] == segment[1][0] == x and sorted([segment[0][1], segment[1][1]]) == pytest.approx(
                [y - spread, y + spread])
    assert set(marks) == {text.get_text() for text in legend.get_texts()}
    at_one = sorted(x[0] for x in marks.values())  # the six points of 1 shot: apart, and near 1 on its log axis
    assert len(set(at_one)) == 6 and 0.8 < at_one[0] and at_one[-1] < 1.25
    assert list(pre_logits.get_xticks()) == [1, 2] and pre_logits.get_xscale() == "log"
    assert [marks[f"lambda {lam}, article"][0] for lam in ("0.01", "1", "100")] == sorted(
        marks[f"lambda {lam}, article"][0] for lam in ("0.01", "1", "100"))  # in lambda order


def test_without_the_count_of_draws_the_few_shot_legend_still_names_the_bars(drawn, tmp_path):
    fewshot.fewshot_accuracy(FEWSHOT_RUN, {}, tmp_path, print)
    title = drawn[fewshot.FILE].legends[0].get_title().get_text()
    assert "mean accuracy over the random draws" in title and "standard deviation" in title
    assert "article" not in title  # none of its points drawn


def test_the_backbone_caption_names_the_articles_title_and_both_y_axes(drawn, tmp_path):
    series = {"training loss": [[10, 1.1], [20, 0.5]], "evaluation accuracy": [[10, 0.6], [20, 0.98]]}
    backbone.backbone_curves(series, tmp_path, print)
    loss_axis, accuracy_axis = drawn[backbone.CURVES_FILE].axes
    caption = page_maker.CAPTIONS[backbone.CURVES_FILE]
    assert 'the article titled it "ViT Training Loss Curve"' in caption
    assert f"left y axis is the {loss_axis.get_ylabel().lower().split(' (')[0]} (cross-entropy in nats" in caption
    assert f"right y axis the {accuracy_axis.get_ylabel().lower().split(' (')[0]} (a fraction from 0 to 1" in caption


ORIGIN = "model: google/vit-base-patch16-224; data: imagenette2-160 (the project's download)"
# each figure drawn with its provenance line: (the function, its arguments before folder and say, its file)
EVERY_FIGURE = [
    (posemb.cosine_maps, ({"3x3": [[0.1, 0.2, 0.3], [0.0, 0.5, 0.4], [0.2, 1.0, -0.3]]},), posemb.COSINE_FILE),
    (posemb.accuracy_bars, ({f"{row} of {n}": 50.0 for row in posemb.POSEMB_ROWS for n in (10, 1000)}, {}),
     posemb.ACCURACY_FILE),
    (backbone.backbone_curves, ({"training loss": [[10, 1.1]], "evaluation accuracy": [[10, 0.6]]},),
     backbone.CURVES_FILE),
    (fewshot.fewshot_accuracy, (FEWSHOT_RUN, {}), fewshot.FILE),
    (finetune.finetune_curves, ({"training loss": [2.3, 2.2], "gradient norm": [1.5, 1.4],
                                 "learning rate": [0.003, 0.0]}, {"step 0 validation": 10.0}, {}), finetune.FILE),
    (backbone.backbone_feature_maps, ({"pictures": [[[[0, 0, 0]]]], "before": [[[[0.5] * 3]]],
                                       "after": [[[[0.5] * 3]]], "labels": ["healthy"]},), backbone.MAPS_FILE),
]


@pytest.mark.parametrize("draw,arguments,file", EVERY_FIGURE, ids=[file for _, _, file in EVERY_FIGURE])
def test_each_figure_carries_the_model_and_data_it_shows_where_nothing_covers_it(draw, arguments, file, drawn,
                                                                                tmp_path):
    """The line is readable in the PNG: matplotlib's own boxes, as savefig draws the figure (its tight crop moves a
    legend below the axes), say that no legend, axis (its labels and ticks included) or title overlaps it (a legend
    sat on it, and posemb's x label)."""
    draw(*arguments, tmp_path, print, origin=ORIGIN)
    figure, covering = drawn[file], []  # [what covers the line] each time the figure is drawn

    def covers(event):
        line = next(text for text in figure.texts if text.get_text() == ORIGIN).get_window_extent(event.renderer)
        others = [*figure.legends, *figure.axes, *(text for text in figure.texts if text.get_text() != ORIGIN)]
        covering.append([other for other in others if other.get_window_extent(event.renderer).overlaps(line)
                         or other.get_tightbbox(event.renderer).overlaps(line)])

    figure.canvas.mpl_connect("draw_event", covers)
    figure.savefig(io.BytesIO(), format="png", dpi=100, bbox_inches="tight")  # as figures.save() writes it
    assert covering and not any(covering)


def test_the_provenance_of_a_stand_in_says_its_numbers_are_not_the_articles(tmp_path):
    from figures import provenance
    from job.standins import imagenette_folder

    folder = imagenette_folder(tmp_path / "nette", per_class=1)
    assert provenance("google/vit-base-patch16-224", str(folder)) == (
        f"model: google/vit-base-patch16-224; data: {folder}; a stand-in generated by job/standins.py (random "
        "weights or generated pictures): its numbers are not the article's")
    assert provenance("m", "d") == "model: m; data: d"


FINETUNE_SERIES = {"training loss": [2.3, 2.2], "gradient norm": [1.5, 1.4], "learning rate": [0.003, 0.0],
                   "clipping threshold": 1.0}


def test_a_figure_that_cannot_be_written_is_one_warning_naming_it_and_why_and_raises_nothing(tmp_path):
    """A figure is a convenience: its failure must not turn a section whose numbers were printed into one that
    "could not run" (the PNG's path is a folder here: the rename over it fails, as on a full disk)."""
    (tmp_path / finetune.FILE).mkdir()
    said = []
    assert finetune.finetune_curves(FINETUNE_SERIES, {"step 0 validation": 10.0}, {}, tmp_path, said.append) is None
    assert said == [f"warning: cannot write the figure {tmp_path / finetune.FILE}: Is a directory"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [finetune.FILE]  # no temporary file left


def test_a_scripts_figure_that_cannot_be_written_leaves_its_section_numbers_json_and_exit_status(tiny_in21k, pictures,
                                                                                               tmp_path, capsys):
    plots, record = tmp_path / "plots", tmp_path / "run.json"
    (plots / finetune.FILE).mkdir(parents=True)
    status, out, err = script_output(vit_part3_finetune.main, [
        "--model", str(tiny_in21k), "--data-dir", str(pictures), "--steps", "2", "--batch-size", "8", "--device",
        "cpu", "--save-dir", str(tmp_path / "save"), "--plots", str(plots), "--json", str(record)], capsys)
    assert status == 0, err
    assert f"warning: cannot write the figure {plots / finetune.FILE}: Is a directory" in err.splitlines()
    assert "cannot run section" not in out + err and "step   2:" in out
    assert json.loads(record.read_text())["could_not_run"] == []
