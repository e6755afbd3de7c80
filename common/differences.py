"""How a run's setup differs from the article's, {item: {"flag", "why", ...}}: what --compare reads (docs/layout.md)."""


def flag_differences(args, article_flags):
    """{item: difference} for each flag whose value is not the article's; article_flags: {item: (dest, value)}."""
    differences = {}
    for item, (dest, article) in article_flags.items():
        value = getattr(args, dest)
        if value != article:
            value_text, article_text = (f"{v:g}" if isinstance(v, float) else str(v) for v in (value, article))
            flag = f"--{dest.replace('_', '-')} {value_text}"
            differences[item] = {"flag": flag, "why": f"{flag}: the article's is {article_text}"}
    return differences


def subset_differences(args, counts, released):
    """{item: difference} for each split ("validation pictures") of which this run used (counts; None: not loaded)
    another number of pictures than the release (released), with n and of for the sampling interval."""
    differences = {}
    for item, count in counts.items():
        if args.per_class and count is None:
            differences[item] = {"flag": f"--per-class {args.per_class}",
                                 "why": f"--per-class {args.per_class}: the first {args.per_class} {item} of each class"}
        elif count is not None and count != released[item]:
            flag = f"--per-class {args.per_class}" if args.per_class else f"--data-dir {args.data_dir}"
            how = f"the first {args.per_class} of each class" if args.per_class else "a partial copy"
            differences[item] = {"flag": flag, "why": f"{flag}: {count:,} of {released[item]:,} {item} ({how})",
                                 "n": count, "of": released[item]}
    return differences

