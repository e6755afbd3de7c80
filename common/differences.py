"""How a run's setup differs from the article's, {item: {"flag", "why", ...}}: what --compare reads (docs/layout.md)."""


def flag_differences(args, article_flags):
    """{item: difference} for each flag whose value is not the article's; article_flags: {item: (dest, value)}."""
    differences = {}
    for item, (dest, article) in article_flags.items():
        value = getattr(args, dest)
        if value != article:
            flag = f"--{dest.replace('_', '-')} {value:g}" if isinstance(value, float) else f"--{dest.replace('_', '-')} {value}"
            differences[item] = {"flag": flag, "why": f"{flag}: the article's is {article:g}"
                                 if isinstance(article, float) else f"{flag}: the article's is {article}"}
    return differences


def subset_differences(args, counts, released, how_chosen="the first {n} of each class"):
    """{item: difference} for each split ("validation pictures") of which this run used (counts; None: not loaded)
    another number of pictures than the release (released), with n and of for the sampling interval."""
    differences = {}
    for item, count in counts.items():
        if args.per_class and count is None:
            differences[item] = {"flag": f"--per-class {args.per_class}",
                                 "why": f"--per-class {args.per_class}: the first {args.per_class} {item} of each class"}
        elif count is not None and count != released[item]:
            flag = f"--per-class {args.per_class}" if args.per_class else f"--data-dir {args.data_dir}"
            how = how_chosen.format(n=args.per_class) if args.per_class else "a partial copy"
            differences[item] = {"flag": flag, "why": f"{flag}: {count:,} of {released[item]:,} {item} ({how})",
                                 "n": count, "of": released[item]}
    return differences


def cell_differences(args, article_table, cells):
    """{dest: difference} for each flag that picks other rows or columns of the article's table (article_table,
    {"shots": [1, 5, 10]}) than the article; cells: {reference name: {dest: its value}}."""
    differences = {}
    for dest, article in article_table.items():
        values = getattr(args, dest)
        if sorted(values) != sorted(article):
            shown = " ".join(f"{value:g}" for value in values)
            differences[dest] = {"flag": f"--{dest} {shown}", "moves": False,
                                 "removes": [name for name, cell in cells.items() if cell[dest] not in values],
                                 "why": f"--{dest} {shown}: the article's are {', '.join(f'{v:g}' for v in article)}"}
    return differences
