"""The README kept true: one page, set-up early, links that lead somewhere, commands the scripts accept, the
articles' headline numbers as the reference files hold them, and the tables reproduce.py's --quick flags and
estimates are read from.

Nothing here runs a script: each command shown is handed to its script's own argparse parser, captured as
tests/test_reproduce.py captures it (ScriptParser.parse_args patched to raise before any work).
"""
import argparse
import ast
import importlib
import json
import re
import shlex

import pytest
from conftest import ROOT

import reproduce
from common.run import ScriptParser
from common.start_and_end import UserError
from compare.verdicts import judge
from job.ending import section_count
from job.scripts import SCRIPTS

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
NAMES = {"setup": "vit_part3_setup.py", "posemb": "vit_part3_posemb.py", "fewshot": "vit_part3_fewshot.py",
         "finetune": "vit_part3_finetune.py", "backbone": "vit_backbone.py"}
MAX_LINES, SET_UP_BEFORE = 200, 40


def without_code_blocks(text):
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def section(path, title):
    """The text under the heading `## title` of a Markdown file, up to the next `## ` heading."""
    text = path.read_text()
    assert f"\n## {title}\n" in text, f"{path.name} has no heading '## {title}'"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def table(path, title, column):
    """{script: cell} of the table under `## title`, its rows naming a script in the first cell."""
    cells = {}
    for line in section(path, title).splitlines():
        if not line.startswith("|"):
            continue
        parts = [part.strip() for part in line.strip().strip("|").split("|")]
        script = next((s for s, name in NAMES.items() if parts and name in parts[0]), None)
        if script and len(parts) > column:
            cells[script] = parts[0].strip("`") if column == 0 else parts[column]
    return cells


def seconds_of(cell):
    """'11 s', '4.2 min', 'about 2.3 h (extrapolated)' -> seconds."""
    number, unit = re.search(r"([\d.]+) (s|min|h)\b", cell).groups()
    return float(number) * {"s": 1, "min": 60, "h": 3600}[unit]


# ---------------------------------------------------------------- one page

def test_the_readme_is_one_page_with_the_set_up_before_line_40():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES
    assert lines.index("## Set-up") + 1 < SET_UP_BEFORE


def commands(block):
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


def test_the_set_up_is_the_articles_block_verbatim_then_two_commands_and_ci_runs_the_second_verbatim():
    from conftest import ARTICLE

    article = ARTICLE.read_text().split("Run it yourself", 1)[1].split("bashCopy\n\n", 1)[1].split("\n\n")[0]
    assert commands(section(README, "Set-up").split("```")[1]) == article.splitlines()
    assert commands(section(README, "Set-up").split("```")[3]) == ["make quick", "make test"]
    assert commands(section(README, "Tests").split("```")[1]) == ["make test"]
    assert commands((ROOT / ".ci" / "run").read_text())[-1] == "make test"


def locked_torch():
    return re.search(r"^torch==(\S+)$", (ROOT / "requirements.lock").read_text(), re.MULTILINE).group(1)


def test_the_makefile_installs_the_locks_torch_then_the_lock_and_runs_the_readmes_commands():
    recipe = (ROOT / "Makefile").read_text()
    torch_line = recipe.index("pip install -q $(TORCH) $(TORCH_BUILD)")
    assert "TORCH := $(shell grep '^torch==' requirements.lock)" in recipe
    assert "--no-deps --index-url https://download.pytorch.org/whl/cpu" in recipe
    assert torch_line < recipe.index("pip install -q -r requirements.lock") < recipe.index("pip check")
    assert "$(VENV)/bin/python reproduce.py --quick\n" in recipe
    assert "HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -n auto --dist loadgroup\n" in recipe


def test_the_manual_set_up_installs_the_lock_after_the_cpu_only_torch_of_the_same_version():
    manual = commands(section(ROOT / "docs" / "setup.md",
                              "By hand, or into an environment of your own").split("```")[1])
    cpu = next(line for line in manual if "download.pytorch.org/whl/cpu" in line)
    assert cpu.startswith(f"pip install torch=={locked_torch()} ")
    assert manual.index(cpu) < manual.index("pip install -r requirements.lock")
    assert "HF_HUB_OFFLINE=1 pytest -n auto --dist loadgroup" in manual


def test_the_headline_numbers_are_the_articles():
    """Each bold number of the headline column is an article number of that script's reference file, as shown."""
    headlines = table(README, "What it reproduces", 2)
    assert sorted(headlines) == sorted(NAMES)
    for script, cell in headlines.items():
        article = json.loads((ROOT / "data" / f"reference_{script}.json").read_text())["numbers"]
        values = [float(entry["article"].replace(",", "")) for entry in article.values()
                  if re.fullmatch(r"-?[\d,]+(\.\d+)?", entry["article"])]
        shown = re.findall(r"\*\*(-?[\d,]+(?:\.\d+)?)%?\*\*", cell)
        assert shown, script
        for text in shown:
            digits = len(text.partition(".")[2])
            assert any(round(value, digits) == float(text.replace(",", "")) for value in values), (script, text)


# ---------------------------------------------------------------- links

def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    return {slug(line.lstrip("#")) for line in without_code_blocks(path.read_text()).splitlines()
            if line.startswith("#")}


def test_every_relative_link_of_the_readme_leads_to_a_file_and_heading_that_exist():
    links = re.findall(r"\]\(([^)\s]+)\)", without_code_blocks(README.read_text()))
    relative = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in relative)
    for link in relative:
        target, _, anchor = link.partition("#")
        path = (README.parent / target) if target else README
        assert path.is_file(), link
        assert not anchor or anchor in anchors(path), link


# ---------------------------------------------------------------- the commands shown

def shown_commands(path):
    """(script, its arguments, the command as shown) of every `python SCRIPT ...` and `torchrun ... SCRIPT ...` in
    the file's code blocks and code spans; `python -m MODULE` when MODULE is the repository's."""
    text = path.read_text()
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    candidates = [line for block in blocks for line in block.splitlines()]
    candidates += re.findall(r"`([^`\n]+)`", without_code_blocks(text))
    for candidate in candidates:
        for part in re.split(r"&&|;|\|\|", candidate):
            try:
                tokens = shlex.split(part, comments=True)
            except ValueError:
                continue
            while tokens and re.fullmatch(r"[A-Z_]+=\S*", tokens[0]):  # HF_HUB_OFFLINE=1 python ...
                tokens.pop(0)
            if len(tokens) < 2:
                continue
            shown = shlex.join(tokens)
            if tokens[0] in ("python", "python3") and tokens[1] == "-m":
                module = tokens[2] if len(tokens) > 2 else ""
                if (ROOT / (module.replace(".", "/") + ".py")).is_file():
                    yield module, tokens[3:], shown
            elif tokens[0] in ("python", "python3"):
                yield tokens[1], tokens[2:], shown
            elif tokens[0] == "torchrun":
                at = next(i for i, token in enumerate(tokens) if token.endswith(".py"))
                yield tokens[at], tokens[at + 1:], shown


COMMANDS = [(path.relative_to(ROOT).as_posix(), *command) for path in PAGES
            for command in dict.fromkeys((script, tuple(arguments), shown)
                                         for script, arguments, shown in shown_commands(path))]


class Parsed(Exception):
    pass


class Refused(Exception):
    pass


def script_parser_of(script, monkeypatch):
    """The argparse parser a script's main() builds, caught before it parses anything."""
    if script.endswith(".py"):
        assert (ROOT / script).is_file(), f"{script}: no such script in the repository"
        script = script.removesuffix(".py").replace("/", ".")
    module = importlib.import_module(script)

    def capture(parser, argv=None, namespace=None):
        raise Parsed(parser)

    monkeypatch.setattr(ScriptParser, "parse_args", capture)
    with pytest.raises(Parsed) as parsed:
        module.main([])
    return parsed.value.args[0]


def parse(parser, arguments, monkeypatch):
    def refuse(parser, message):
        raise Refused(message)

    monkeypatch.setattr(ScriptParser, "error", refuse)
    return argparse.ArgumentParser.parse_args(parser, arguments)


def test_the_offline_example_of_docs_reproduce_md_counts_as_the_job_does():
    """Its setup row and its conclusions line, which said 9 of 9 sections and 52 conclusions after both had changed:
    the setup script's sections, and the conclusions of data/ a job with no JSON but setup's counts."""
    example = (ROOT / "docs" / "reproduce.md").read_text().split("An example", 1)[1].split("## Flags", 1)[0]
    sections, conclusions = section_count("setup"), sum(len(judge(script, {})[1]) for script in SCRIPTS)
    assert f", {sections} of {sections} sections;" in example and f"| {sections} of {sections}  " in example
    counts = re.search(rf"(\d+) hold, 0 fail, 0 undecided, (\d+) not run, 0 not comparable \(of {conclusions} "
                       r"conclusions\)", example)
    assert counts and int(counts[1]) + int(counts[2]) == conclusions


def test_the_readme_shows_a_command_of_each_script():
    shown = {script for page, script, arguments, command in COMMANDS if page == "README.md"}
    assert set(NAMES.values()) | {"reproduce.py"} <= shown


@pytest.mark.parametrize(("page", "script", "arguments", "command"), COMMANDS,
                         ids=[f"{page}: {command}" for page, _, _, command in COMMANDS])
def test_every_command_shown_is_one_its_script_accepts(page, script, arguments, command, monkeypatch):
    try:
        args = parse(script_parser_of(script, monkeypatch), list(arguments), monkeypatch)
        if script == "reproduce.py":  # each --extra SCRIPT=FLAGS: its script's flags, and their values
            for name, flags in reproduce.extra_flags(args.extra).items():
                if flags:
                    parse(script_parser_of(NAMES[name], monkeypatch), flags, monkeypatch)
    except (Refused, UserError) as refused:
        pytest.fail(f"{page}: `{command}` is refused: {refused}")


# ---------------------------------------------------------------- the tables reproduce.py reads

def test_quick_flags_equal_the_readme_quick_check_table():
    commands = table(README, "Quick check", 0)
    assert sorted(commands) == sorted(NAMES)
    for script, command in commands.items():
        tokens = shlex.split(command)[2:]  # after "python vit_....py"
        tokens.remove("--compare")  # the job always compares
        if "--save-dir" in tokens:  # fine-tuning's checkpoint goes to OUT/finetune-run in the job
            at = tokens.index("--save-dir")
            del tokens[at:at + 2]
        assert SCRIPTS[script]["quick"] == tokens, script


def test_the_estimates_start_from_the_readme_times():
    quick, full = table(README, "Quick check", 3), table(ROOT / "docs" / "performance.md", "How long will it take", 1)
    for script in NAMES:
        assert reproduce.REFERENCE["quick"]["seconds"][script] == pytest.approx(seconds_of(quick[script]))
        assert reproduce.REFERENCE["full"]["seconds"][script] == pytest.approx(seconds_of(full[script]))


def test_the_quick_jobs_time_is_its_measured_whole_and_holds_the_scripts():
    row = next(line for line in section(README, "Quick check").splitlines()
               if line.startswith("| `python reproduce.py --quick`"))
    cell, quick = row.strip().strip("|").split("|")[3].strip(), reproduce.REFERENCE["quick"]
    assert cell == f"{reproduce.duration(quick['job'])} (measured whole)"
    assert quick["job"] >= sum(quick["seconds"].values())  # the job's clock runs over every script's process
    text, scripts = " ".join(README.read_text().split()), sum(quick["seconds"].values())
    assert f"not the scripts' sum ({reproduce.duration(scripts)})" in text
    # the job's first lines shown: the scripts' times scaled by 80 / 68 GFLOP/s, as estimate_seconds does
    assert f"time: about {reproduce.duration(scripts * quick['gflops'] / 68)} for 5 script(s)" in text


def test_the_downloads_column_names_what_each_script_fetches_and_the_counts_are_true():
    """What reproduce.py plans to fetch for a script (job/downloads.py) is what the README's table says it downloads;
    the table's rows are the scripts and the benchmark the sentence above it counts."""
    from job import downloads

    said = {downloads.VIT: "ViT-B/16", downloads.IN21K: "ViT-B/16 in21k", downloads.IMAGENETTE: "Imagenette",
            downloads.BEANS: "beans", downloads.RESNET: "microsoft/resnet-50"}
    cells = table(README, "What it reproduces", 3)
    for script in NAMES:
        fetched = SCRIPTS[script]["needs"] + SCRIPTS[script]["optional"]
        # the cell's names: its items between commas and semicolons, each up to " when", remarks in brackets left out
        named = {item.split(" when ")[0].strip() for item in re.split(r"[,;]", re.sub(r"\([^)]*\)", "", cells[script]))}
        assert {piece for piece, words in said.items() if words in named} == set(fetched), script
    rows = [line for line in section(README, "What it reproduces").splitlines() if line.startswith("| `")]
    opening = README.read_text().split("\n\n", 2)[1]
    assert len(rows) == 6 and opening.startswith("Five scripts") and "and a benchmark" in opening.split(":")[0]


def test_the_readme_writes_no_download_size_and_its_example_is_the_line_the_job_prints_from_pieces():
    """A download's size is written once, in job/downloads.py's PIECES: the README states none, and its example of
    the job's first lines is the line fetch_line prints from PIECES, with the sizes left out."""
    from job import downloads

    text = README.read_text()
    assert not re.findall(r"\d+(?:\.\d+)? ?MB\b", text)
    pieces = [downloads.RESNET, downloads.VIT, downloads.IMAGENETTE, downloads.IN21K, downloads.BEANS]
    printed = downloads.fetch_line(pieces)
    for piece in pieces:
        assert f"{piece} ({downloads.PIECES[piece][0]} MB)" in printed, piece
    example = next(line for line in text.splitlines() if line.startswith("to download, once"))
    assert example == re.sub(r"\d+(?:\.\d+)? (MB|GB)", r"... \1", printed)


# The quick check's setup, as each script records it under the Quick check table's flags: n pictures of the
# article's, the flags that change a conclusion's input, and the numbers a run paused after step 5 does not make.
QUICK_SETUPS = {
    "setup": ({}, []),
    "posemb": ({"validation pictures": {"flag": "--per-class 5", "why": "--per-class 5: 50 of 3,925", "n": 50,
                                        "of": 3925}}, []),
    "fewshot": ({"validation pictures": {"flag": "--per-class 10", "why": "--per-class 10: 100 of 3,925", "n": 100,
                                         "of": 3925}}, []),
    "finetune": ({"checked pictures": {"flag": "--check-per-class 5", "why": "--check-per-class 5: 50 checked"}},
                 ["mean loss first", "mean loss last", "clipped steps", "median norm first", "median norm last",
                  "passes", "pictures seen", "average accuracy", "last accuracy"]),
    "backbone": ({"epochs": {"flag": "--epochs 2", "why": "--epochs 2"},
                  "batch_size": {"flag": "--batch-size 1", "why": "--batch-size 1"},
                  "training pictures": {"flag": "--per-class 5", "why": "--per-class 5: 15 of 1,034", "n": 15,
                                        "of": 1034},
                  "validation pictures": {"flag": "--per-class 5", "why": "--per-class 5: 15 of 133", "n": 15,
                                          "of": 133}}, []),
}


def decided_line(script, rows):
    """The README's line for a quick check: how many conclusions it decides at the article's numbers, and why not
    the others."""
    words = [f"decides {sum(row['verdict'] == 'holds' for row in rows)} of {len(rows)}"]
    undecided = sorted(row["pictures"] for row in rows if row["verdict"] == "undecided")
    if undecided:
        counts = [f"{n:,}" for n in undecided]
        listed = counts[0] if len(counts) == 1 else ", ".join(counts[:-1]) + " and " + counts[-1]
        words.append(f"undecided {len(undecided)} (about {listed} pictures would decide them)")
    not_run = sum(row["verdict"] == "not run" for row in rows)
    if not_run:
        words.append(f"not run {not_run} (after step 5)")
    flags = sorted({flag for row in rows for flag in row.get("flags", ())})
    if flags:
        words.append(f"not comparable {sum(row['verdict'] == 'not comparable' for row in rows)} ({', '.join(flags)})")
    return f"- `{NAMES[script]}`: " + "; ".join(words)


@pytest.mark.parametrize("script", sorted(QUICK_SETUPS))
def test_the_quick_checks_conclusions_are_what_the_rules_decide_at_the_articles_numbers(script):
    """Each sampled accuracy counted on the quick check's pictures at the article's share (a mean: each draw so),
    a paused fine-tuning's later numbers left out, then the rules."""
    from compare.verdicts import judge, load_reference

    differences, missing = QUICK_SETUPS[script]
    sample = differences.get("validation pictures", {}).get("n")
    numbers = {}
    for name, entry in load_reference(script).items():
        if name in missing or (script == "finetune" and name.startswith("step ") and int(name.split()[1]) > 5):
            continue
        value = float(entry["article"].replace(",", ""))
        numbers[name] = {"value": value}
        if entry.get("sample") and sample:
            right = round(value * sample / 100)
            numbers[name] = {"value": 100 * right / sample, "right": [right] * 5 if script == "fewshot" else right,
                             "of": sample}
    line = decided_line(script, judge(script, numbers, differences)[1])
    assert line in section(README, "Quick check").splitlines()


def imported(path):
    """The project's modules a file imports, by dotted name (at its top or inside a function)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def loaded_at_import(path):
    """The project's files that importing path loads, itself aside: the closure of the imports outside its functions
    (at its top, and in the ifs and trys there), each package's __init__.py with its modules."""
    import ast

    def resolved(name):  # a.b: a/__init__.py, then a/b.py or a/b/__init__.py, those that are the project's
        parts, files = name.split("."), []
        for k in range(1, len(parts) + 1):
            base = ROOT.joinpath(*parts[:k])
            files += [file for file in (base.with_suffix(".py"), base / "__init__.py") if file.is_file()]
        return files

    def imports(file):
        names, statements = set(), list(ast.parse(file.read_text()).body)
        while statements:
            node = statements.pop()
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, (ast.If, ast.Try)):  # run at import; a function's or class's body is not
                statements += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                               *(line for handler in getattr(node, "handlers", []) for line in handler.body)]
        return {file for name in names for file in resolved(name)}

    loaded, new = set(), {path}
    while new:
        loaded |= new
        new = set().union(*map(imports, new)) - loaded
    return loaded - {path}


@pytest.mark.parametrize("script, most", [("vit_part3_setup.py", 1250), *(
    (name, 2650) for name in ("vit_part3_posemb.py", "vit_part3_fewshot.py", "vit_part3_finetune.py",
                              "vit_backbone.py"))])
def test_a_script_carries_at_most_the_lines_docs_layout_states(script, most):
    """What a reader of a script carries at its import; the record and the environment (compare/record.py) load only
    when --compare or --json asks for them, through conclude's one call."""
    files = loaded_at_import(ROOT / script)
    lines = sum(len(file.read_text().splitlines()) for file in files)
    assert lines <= most, (lines, sorted(str(file.relative_to(ROOT)) for file in files))
    assert ROOT / "compare" / "record.py" not in files
    assert f"at most {most:,} of the project's lines" in " ".join((ROOT / "docs" / "layout.md").read_text().split())


def test_the_projects_modules_import_one_another_in_no_circle():
    """docs/layout.md: what each module imports at its top never leads back to it."""
    modules = [path for path in ROOT.rglob("*.py") if not {"tests", "benchmarks", ".venv"} & set(path.parts)
               and not any(part.startswith(".venv") for part in path.relative_to(ROOT).parts)]
    for module in modules:
        assert module not in loaded_at_import(module), module.relative_to(ROOT)


def test_docs_layouts_claims_about_modules_hold():
    """docs/layout.md: common/ is seven modules, none over 500 lines, 1,500 in all; nothing in common/ imports a script
    or job/; nothing outside tests/ and benchmarks/ imports a script; every job/ module is named in its paragraph on
    the rest."""
    layout = " ".join((ROOT / "docs" / "layout.md").read_text().split())
    common = sorted((ROOT / "common").glob("*.py"))
    sizes = [len(path.read_text().splitlines()) for path in common]
    assert "seven modules, none over 500 lines and at most 1,500 in all" in layout
    assert len(common) - 1 == 7 and max(sizes) <= 500 and sum(sizes) <= 1500, sizes  # - 1: __init__.py
    scripts = {path.stem for path in ROOT.glob("vit_*.py")}
    outside = [path for folder in ("common", "job", "figures") for path in (ROOT / folder).glob("*.py")]
    for path in [*outside, ROOT / "reproduce.py"]:
        wrong = {name for name in imported(path) if name.split(".")[0] in scripts}
        if path.parent.name == "common":
            wrong |= {name for name in imported(path) if name.split(".")[0] == "job"}
        assert not wrong, (path.relative_to(ROOT), wrong)
    rest = layout[layout.index("## The rest"):]
    assert all(f"`{path.name}`" in rest for path in (ROOT / "job").glob("*.py") if path.name != "__init__.py")


@pytest.mark.parametrize("script", sorted(path.name for path in ROOT.glob("vit_*.py")))
def test_main_calls_each_section_by_name_in_the_order_they_are_written(script):
    """docs/layout.md: main() is the script's story; no runner calls its sections back."""
    tree = ast.parse((ROOT / script).read_text())
    written = [node.name for node in tree.body
               if isinstance(node, ast.FunctionDef) and node.name.startswith("section_")
               and [getattr(decorator, "id", None) for decorator in node.decorator_list] == ["section"]]
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    called = [node.func.id for node in ast.walk(main) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id.startswith("section_")]
    assert written and called == written
