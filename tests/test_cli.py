"""common/run.py: each script's --batch-size help speaks of its own work, and every flag's help names its default."""
import pytest


@pytest.mark.parametrize("script,own,other", [
    ("vit_part3_posemb", "evaluation passes", ("fine-tun", "optimizer")),
    ("vit_part3_fewshot", "extract the frozen features", ("fine-tun", "optimizer")),
    ("vit_part3_finetune", "per optimizer step", ("evaluation", "features")),
])
def test_each_scripts_batch_size_help_speaks_of_its_own_work(script, own, other, capsys):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(script).main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    help_text = text.rsplit("--batch-size BATCH_SIZE ", 1)[1].split(" --precision", 1)[0]
    assert own in help_text and not any(word in help_text for word in other), help_text


def test_every_flag_with_a_default_names_it_in_its_help():
    """--help states each default: the help of a flag that has one carries %(default)s, which argparse fills in."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    silent = []
    for path in [*root.glob("*.py"), *root.glob("common/*.py"), *root.glob("job/*.py"), *root.glob("benchmarks/*.py")]:
        source = path.read_text()
        if "script_parser(" not in source and "experiment_parser(" not in source:  # the project's parsers
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                keywords = {keyword.arg: keyword.value for keyword in node.keywords}
                default = keywords.get("default", ast.Constant(None))
                unset = isinstance(default, ast.Constant) and (default.value is None or default.value is False)
                if not unset and "%(default)" not in ast.get_source_segment(source, keywords.get("help", default)):
                    silent.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not silent, f"flags whose help does not name their default: {silent}"
