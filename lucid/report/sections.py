"""Turn `ReportFacts` into the report's sections (the neutral `Document` both formats render).

Section ids are stable (`model.SECTION_IDS`) and so are cell ids (`bound-<c>-upper`,
`acc-<method>-<eps>`, `noised-<method>`, `ledger-<client>-<field>`, ...), so a reader's tool can
find a number without parsing prose. A value that does not exist is said in words ("not run",
"not served", "nothing proved") instead of being left out, because a reviewer cannot tell a
missing row from a forgotten one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from lucid.report import caveats, figures
from lucid.report.facts import ClassBound, ReportFacts
from lucid.report.model import Bullets, Cell, Document, Figure, Heading, Paragraph, Section, Table

_DOMAIN_ROWS = 16  # features listed in the domain table; the rest are summarised
_NAMES = {"lucid": "LUCID", "naive_idp": "Naive-iDP", "naive_noise": "Naive-Noise"}


def num(v: float | None, digits: int = 6) -> str:
    if v is None:
        return "–"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    return f"{v:.{digits}g}"


def pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f} %"


def _v(x: Any) -> Any:
    """A JSON-safe cell value (infinities become strings, as in the run directory's files)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else ("-inf" if x < 0 else None)
    return x


def build_document(facts: ReportFacts) -> Document:
    """The whole report; draws the figures (the only slow step here)."""
    return Document(
        title="LUCID privacy report",
        subtitle=f"run {facts.run} · generated {facts.generated} · LUCID {facts.lucid_version}",
        sections=(
            _summary(facts),
            _training(facts),
            _bounds(facts),
            _figure6(facts),
            _accuracy(facts),
            _ledger(facts),
            _caveats(facts),
        ),
    )


def _summary(f: ReportFacts) -> Section:
    classes = f.verification.classes
    kinds = {
        "proved, exact": "proved exactly",
        "proved, complete": "proved (complete)",
        "proved, within the requested gap": "proved within the requested gap",
    }
    counts: dict[str, int] = {}
    for c in classes:
        kind = "with nothing proved" if c.upper is None else kinds.get(c.status, "with a sound but time-limited bound")
        counts[kind] = counts.get(kind, 0) + 1
    items = [
        (
            "Bounds",
            f"{len(classes)} of {f.training.num_classes} classes verified: "
            + ", ".join(f"{n} {kind}" for kind, n in counts.items())
            + ".",
        )
    ]
    blocks: list = []
    ev = f.evaluation
    if ev is not None:
        acc = ev.result["accuracy"]
        items.append(
            (
                "Accuracy",
                f"N without protection {pct(acc['plain'])}; LUCID at ε = "
                + ", ".join(f"{k}: {pct(acc['lucid'][k])}" for k in ev.epsilons)
                + f"; {pct(ev.result['noised_fraction']['lucid'])} of test inputs noised "
                f"(Naive-iDP: {pct(ev.result['noised_fraction']['naive_idp'])}).",
            )
        )
        if ev.released_but_leaking:
            blocks.append(
                Paragraph(
                    f"WARNING: {ev.released_but_leaking} test inputs are released although a "
                    "leave-one-out network labels them differently: bounds.json is UNSOUND for "
                    "this run. Do not serve it.",
                    "warning",
                )
            )
    else:
        items.append(("Accuracy", f.evaluation_note))
    items.append(
        ("Baselines", (", ".join(f.baselines.methods) or "only non-private ones") if f.baselines else "not run")
    )
    if f.ledger is not None and f.ledger.rows:
        every = next((r for r in f.ledger.rows if r.client == "*"), None)
        clients = sum(r.client != "*" for r in f.ledger.rows)
        items.append(
            (
                "Served",
                f"{clients} client(s) in the ledger"
                + (f"; {every.answers} distinct answers drawn, {every.noised} noised" if every else "")
                + ".",
            )
        )
    else:
        items.append(("Served", "no privacy ledger (the run has not been served with a memo)."))
    if f.training.domain_from_data:
        blocks.append(
            Paragraph(
                f"The verified domain {_fitted(f.training)}: it reveals the data's extremes. See the caveats.",
                "warning",
            )
        )
    return Section("summary", "Summary", (Paragraph(f"Run directory `{f.run}`."), Bullets(tuple(items)), *blocks))


def _fitted(t) -> str:
    """How a box that coincides with the data's extremes came to be, as far as the run says."""
    if t.domain_given:
        return (
            "given in the import's manifest coincides with the data's minima and maxima (unless those bounds "
            "are public, they were fitted to the data)"
        )
    return "appears fitted to the data's minima and maxima (no public domain was given)"


def _training(f: ReportFacts) -> Section:
    t = f.training
    rows = [
        ("data", "data source", t.data_source, t.data_source),
        ("train_size", "training rows |D|", str(t.train_size), t.train_size),
        ("test_size", "test rows", str(t.test_size), t.test_size),
        ("input_dim", "features", str(t.input_dim), t.input_dim),
        ("num_classes", "classes (labels)", f"{t.num_classes} ({', '.join(map(str, t.labels))})", t.num_classes),
        ("architecture", "architecture", t.architecture, t.architecture),
        ("algorithm", "training algorithm T", t.algorithm, t.algorithm),
        ("epochs", "epochs", num(t.epochs), t.epochs),
        ("lr", "learning rate", num(t.lr), t.lr),
        ("weight_decay", "weight decay", num(t.weight_decay), t.weight_decay),
        ("batch_size", "batch size", num(t.batch_size), t.batch_size),
        ("seed", "seed", num(t.seed), t.seed),
        ("networks", "networks trained", f"{t.networks}: N and {t.loo_networks} leave-one-out networks", t.networks),
    ]
    if t.fine_tuned_from:
        rows.append(("init", "fine-tuned from (sha256)", t.fine_tuned_from, t.fine_tuned_from))
        rows.append(
            (
                "trainable_layers",
                "trained layers",
                ", ".join(map(str, t.trainable_layers or ())) or "all",
                list(t.trainable_layers or ()),
            )
        )
    if t.external is not None:  # the manifest's record replaces lucid train's settings, which it lacks
        name, version, description = t.external
        rows = [r for r in rows if r[0] not in ("epochs", "lr", "weight_decay", "batch_size", "seed")]
        algorithm = f"{name} {version}".strip() + " (trained elsewhere, imported with lucid import)"
        rows = [("algorithm", "training algorithm T", algorithm, name) if r[0] == "algorithm" else r for r in rows]
        rows.insert(7, ("description", "T as its owner describes it", description or "–", description))
        if version:
            rows.insert(7, ("version", "version of T", version, version))
    if t.agt_max_k:
        rows.append(("agt", "AGT boxes for k removed rows", f"k = 1..{t.agt_max_k}", t.agt_max_k))
    rows.append(("fingerprint", "run fingerprint", t.fingerprint or "–", t.fingerprint))
    table = Table(
        "training-table",
        ("", "value"),
        tuple((Cell(label), Cell(text, f"t-{key}", _v(value))) for key, label, text, value in rows),
    )
    n = min(_DOMAIN_ROWS, t.input_dim)
    domain = Table(
        "domain-table",
        ("feature", "lower", "upper"),
        tuple(
            (
                Cell(t.feature_names[j] if j < len(t.feature_names) else f"x{j}"),
                Cell(num(t.domain_lower[j]), f"domain-{j}-lower", _v(t.domain_lower[j])),
                Cell(num(t.domain_upper[j]), f"domain-{j}-upper", _v(t.domain_upper[j])),
            )
            for j in range(n)
        ),
    )
    how = (
        "were supplied by its owner (`lucid import`), trained by T as the manifest names it: LUCID checked "
        "the networks, not their training."
        if t.external is not None
        else "were trained by T with the settings below."
    )
    blocks: list = [
        Paragraph(
            "The guarantee is about this data set and exactly this training algorithm: N and "
            f"every leave-one-out network {how}"
        ),
        table,
        Heading("Verified input domain (original units)"),
        domain,
    ]
    if n < t.input_dim:
        blocks.append(Paragraph(f"… and {t.input_dim - n} more features (see run.json).", "note"))
    origin = {
        True: f"This box {_fitted(t)}: it reveals them.",
        False: "It does not coincide with the data's extremes on any rescaled feature.",
        None: "",
    }[t.domain_from_data]
    blocks.append(Paragraph(f"Only inputs inside this box are answered (or clipped into it). {origin}", "note"))
    return Section("training", "Data and training algorithm T", tuple(blocks))


def _bounds(f: ReportFacts) -> Section:
    v = f.verification
    opts = dict(v.options)
    shown = ", ".join(
        f"--{k.replace('_', '-')} {'none' if opts[k] is None else opts[k]}"
        for k in ("time_limit", "node_time_limit", "gap", "rel_gap", "workers", "screen")
        if k in opts
    )
    header = (
        "class",
        "β_c = upper (proved)",
        "lower (leak found)",
        "u/l",
        "complete",
        "exact",
        "status",
        "time [s]",
        "nodes",
        "leak from row",
        "solver work (log)",
    )
    levels = {c: level for c, level, _ in v.levels}
    by_level = bool(v.residual) and v.regions <= 1  # the rule's threshold is the level: the table shows it
    if by_level:
        header = ("class", "L_c = level (proved)", "lower (leak outside the set)", *header[3:])
    rows = tuple(
        _bound_row(replace(c, upper=levels.get(c.cls)) if by_level and c.cls in levels else c) for c in v.classes
    )
    blocks: list = [
        Paragraph(
            f"Verified with solver {v.solver} ({'leave-one-out networks' if v.hyper == 'loo' else v.hyper})"
            + (f"; {shown}" if shown else "")
            + ". The upper bound β_c is proved: every input N labels c with "
            "confidence above it gets the same label from all networks and is released; the lower bound is a "
            "replayed input that leaks, so the exact decision bound lies between them."
        ),
        Table("bounds-table", header, rows),
    ]
    if v.regions > 1:
        blocks.append(
            Paragraph(
                f"Region-wise bounds: the domain is cut into {v.regions} boxes, each with its own "
                "bound per class (`lucid log RUN` lists them); an input is released when N's "
                "confidence is above the bound of its own box. The table shows each class's bound "
                "over the whole domain (the largest box bound).",
                "note",
            )
        )
    if v.residual:
        level_text = "; ".join(
            f"class {c}: L = {'none proved' if level is None else f'{level:.4g}'}, {size} networks"
            for c, level, size in v.levels
        )

        def highest(bounds: Sequence[float | None]) -> list[float]:
            return sorted((b for b in bounds if b is not None), reverse=True)[:4]

        sets = "; ".join(
            f"class {c}: rows {', '.join(str(r) for r in rows[:8])}{', …' if len(rows) > 8 else ''} (bounds "
            f"{', '.join('–' if b is None else f'{b:.3g}' for b in highest(bounds))}"
            f"{', …' if len(bounds) > 4 else ''})"
            for c, rows, bounds in v.members
            if rows
        )
        every = "; ".join(
            f"class {c.cls}: {'nothing proved' if c.upper is None else f'{c.upper:.4g}'}" for c in v.classes
        )
        blocks.append(
            Paragraph(
                f"Residual check (M = {v.residual}): per class, the M networks with the largest proven "
                "bounds are evaluated at every query, and the level L, the (M+1)-th largest bound, "
                f"covers all the others ({level_text}). An input is released when N's confidence is above "
                "its class's level and every network of the class's set gives N's label; either way "
                "the label is the same from all networks."
                + (f" The sets (the rows their networks were trained without): {sets}." if sets else "")
                + f" Over every network (what a reader without the residual check would use): {every}."
                + (
                    " With region-wise bounds each box has its own sets and levels (those above are "
                    "the whole domain's); the service evaluates the union of every box's sets at "
                    "every query."
                    if v.regions > 1
                    else ""
                ),
                "note",
            )
        )
    if v.choice:
        ch = v.choice
        blocks.append(
            Paragraph(
                f"M was chosen by `--residual auto` (cap {ch.get('cap')}): the smallest M whose rule noises at most "
                f"max(2 × Naive-iDP, + 2 points) of {ch.get('inputs')} ({ch.get('count')} inputs). "
                f"With M = {ch.get('size')} it "
                f"noises {pct(ch.get('noised'))} against Naive-iDP's {pct(ch.get('naive_idp'))} (target "
                f"{pct(ch.get('target'))}, "
                f"{'met' if ch.get('met') else 'missed: M = ' + str(ch.get('needed')) + ' would meet it'}"
                f"); the service evaluates {ch.get('networks_served', 0)} networks besides N at every query "
                f"({(ch.get('bytes_served') or 0) / 1e6:.2f} MB of float64 parameters with N).",
                "note",
            )
        )
    if any(c.removals > 1 for c in v.classes):
        blocks.append(
            Paragraph(
                "Classes verified over an AGT box hold for every data set within K removed rows of D (group iDP).",
                "note",
            )
        )
    if not v.log_present:
        blocks.append(
            Paragraph("No verification log (verify.log.jsonl) was found: solver work per class is not shown.", "note")
        )
    png = figures.anytime_figure(v)
    if png is not None:
        blocks.append(
            Figure(
                "anytime",
                png,
                "Anytime bounds per class during verification (from the log).",
                "upper and lower bound of each class over the verification time",
            )
        )
    return Section("bounds", "Per-class iDP decision bounds", tuple(blocks))


def _bound_row(c: ClassBound) -> tuple[Cell, ...]:
    p = f"bound-{c.cls}"
    work = "–"
    if c.log is not None:
        statuses = ", ".join(f"{k} {n}" for k, n in c.log.statuses)
        work = (
            f"{c.log.solved} nodes solved, {c.log.split} split, {c.log.closed} closed; node time "
            f"{c.log.node_seconds_total:.1f} s (max {c.log.node_seconds_max:.1f} s)"
            + (f"; {statuses}" if statuses else "")
        )
    return (
        Cell(str(c.label), f"{p}-class", c.cls),
        Cell(num(c.upper) if c.upper is not None else "nothing proved", f"{p}-upper", c.upper),
        Cell(num(c.lower), f"{p}-lower", c.lower),
        Cell(num(c.ratio, 5), f"{p}-ratio", c.ratio),
        Cell("yes" if c.complete else "no", f"{p}-complete", c.complete),
        Cell("–" if c.exact is None else ("yes" if c.exact else "no"), f"{p}-exact", c.exact),
        Cell(c.status, f"{p}-status", c.reason),
        Cell(num(c.seconds, 4), f"{p}-seconds", c.seconds),
        Cell(num(c.nodes), f"{p}-nodes", c.nodes),
        Cell(num(c.leaking_row), f"{p}-leaking_row", c.leaking_row),
        Cell(work, f"{p}-log", None if c.log is None else c.log.solved),
    )


def _figure6(f: ReportFacts) -> Section:
    ev = f.evaluation
    if ev is None:
        return Section("figure6", "Test-set confidences against β_c (paper Fig. 6)", (Paragraph(f.evaluation_note),))
    rows = []
    for c, beta in enumerate(ev.betas):
        mine = ev.predicted == c
        conf, released = ev.confidence[mine], int((~ev.noised[mine]).sum())
        share = released / len(conf) if len(conf) else None
        rows.append(
            (
                Cell(str(f.training.labels[c]), f"fig6-{c}-class", c),
                Cell(num(beta) if math.isfinite(beta) else "nothing proved", f"fig6-{c}-beta", _v(beta)),
                Cell(str(len(conf)), f"fig6-{c}-inputs", len(conf)),
                Cell(str(released), f"fig6-{c}-released", released),
                Cell(str(len(conf) - released), f"fig6-{c}-noised", len(conf) - released),
                Cell(pct(share), f"fig6-{c}-share", share),
            )
        )
    text = (
        "For every class c, N's confidence (top score minus runner-up) on each test input N labels c. Inputs "
        "right of the dashed line β_c are released with N's label; inputs at or left of it are answered by the "
        "exponential mechanism."
    )
    if ev.bound_name == "level":
        text = (
            "For every class c, N's confidence (top score minus runner-up) on each test input N labels c. The "
            "dashed line is the class's level L_c (the table's β column): an input right of it is released when "
            "every network of the class's residual set also gives N's label, so a few orange bars may lie right "
            "of it; inputs at or left of it are answered by the exponential mechanism."
        )
    return Section(
        "figure6",
        "Test-set confidences against β_c (paper Fig. 6)",
        (
            Paragraph(text),
            Figure(
                "figure6",
                figures.figure6(ev, f.training.labels),
                "Paper Fig. 6 for this run: blue bars released, orange bars noised, dashed line β_c "
                "(colours are the access layer's own decision per input).",
                "histograms of test-set confidences per class with the bound as a vertical line",
            ),
            Table(
                "figure6-table", ("class", "β_c", "test inputs", "released", "noised", "released share"), tuple(rows)
            ),
        ),
    )


def _accuracy(f: ReportFacts) -> Section:
    ev, base = f.evaluation, f.baselines
    title = "Accuracy and noised share per ε"
    if ev is None:
        return Section("accuracy", title, (Paragraph(f.evaluation_note),))
    acc, res = ev.result["accuracy"], ev.result
    methods = base.methods if base else ()
    header = ("ε", "N (no privacy)", "LUCID", "Naive-iDP", "Naive-Noise", *(methods or ("baselines",)))
    rows = []
    for k in ev.epsilons:
        row = [Cell(k, f"eps-{k}", float(k)), Cell(pct(acc["plain"]), f"acc-plain-{k}", acc["plain"])]
        row += [Cell(pct(acc[m][k]), f"acc-{m}-{k}", acc[m][k]) for m in ("lucid", "naive_idp", "naive_noise")]
        for m in methods:
            r = base.at(m, float(k))
            text = "not run" if r is None else (pct(r.accuracy) if r.accuracy is not None else r.status)
            row.append(Cell(text, f"acc-baseline-{m}-{k}", None if r is None else r.accuracy))
        if not methods:
            row.append(Cell("not run", f"acc-baselines-{k}", None))
        rows.append(tuple(row))
    nf, ms = res["noised_fraction"], res["access_ms"]
    shares = tuple(
        (
            Cell(_NAMES[m]),
            Cell(pct(nf[m]), f"noised-{m}", nf[m]),
            Cell("–" if m not in ms else f"{ms[m]:.4f}", f"ms-{m}", ms.get(m)),
        )
        for m in _NAMES
    )
    blocks: list = [
        Paragraph(
            f"Test accuracy on the run's test split ({f.training.test_size} inputs), computed by `lucid "
            f"evaluate` (noise seed {ev.seed if ev.seed is not None else 'from the OS'}). LUCID noises only "
            "inputs at or below β_c; Naive-iDP noises exactly the inputs some leave-one-out network labels "
            "differently (n+1 forward passes per query); Naive-Noise noises every input."
        ),
        Table("accuracy-table", header, tuple(rows)),
        Heading("Share of test inputs noised (the same at every ε) and access time"),
        Table("noised-table", ("mechanism", "test inputs noised", "access time per query, batched [ms]"), shares),
        Paragraph(f"LUCID single-query access time: {ms['lucid_single_query']:.4f} ms.", "note"),
        Figure("accuracy", figures.accuracy_figure(ev, base), "Test accuracy per ε.", "accuracy per epsilon"),
        Heading("Baselines", "baselines"),
    ]
    if base is None:
        blocks.append(Paragraph(f"Baselines: {f.baselines_note}", "note"))
    else:
        blocks.append(Paragraph('"not run" in the table above: the baseline was not trained at that ε.', "note"))
        blocks.append(
            Table(
                "baselines-table",
                ("method", "ε", "test accuracy", "status"),
                tuple(
                    (
                        Cell(r.method),
                        Cell(num(r.epsilon) if r.epsilon is not None else "none (no privacy)"),
                        Cell(pct(r.accuracy), f"baseline-{i}-accuracy", r.accuracy),
                        Cell(r.message or r.status),
                    )
                    for i, r in enumerate(base.rows)
                ),
                caption=f"from {base.source}",
            )
        )
        blocks.append(
            Paragraph(
                "The baselines give other guarantees than iDP: DP-SGD (ε, δ)-DP for the whole "
                "training, ALIBI ε-label-DP, subsample-and-aggregate ε-DP per answer.",
                "note",
            )
        )
    return Section("accuracy", title, tuple(blocks))


def _ledger(f: ReportFacts) -> Section:
    title = "Privacy ledger (what clients of `lucid serve` have been given)"
    led = f.ledger
    if led is None or not led.rows:
        return Section("ledger", title, (Paragraph(f.ledger_note),))
    rows = []
    for r in led.rows:
        p = f"ledger-{'all' if r.client == '*' else r.client}"
        rows.append(
            (
                Cell("(all clients: memo draws)" if r.client == "*" else r.client, f"{p}-client", r.client),
                Cell(str(r.answers), f"{p}-answers", r.answers),
                Cell(str(r.noised), f"{p}-noised", r.noised),
                Cell("–" if r.client == "*" else str(r.refused), f"{p}-refused", r.refused),
                Cell(num(r.charged), f"{p}-charged", r.charged),
                Cell(num(r.spent), f"{p}-spent", r.spent),
                Cell(num(r.spent_tight), f"{p}-spent_tight", r.spent_tight),
            )
        )
    header = ("client", "answers", "noised", "refused", "charged ε", "spent ε (basic)", f"spent ε (δ = {led.delta:g})")
    return Section(
        "ledger",
        title,
        (
            Paragraph(
                f"From the memo {led.memo}, as `lucid budget` reports it. charged: ε per distinct answer (what "
                "--budget caps); spent (basic): ε per distinct noised answer, an (ε, 0)-iDP statement about the "
                "client's labels; spent (δ): the optimal (ε, δ) composition of those noised answers."
            ),
            Table("ledger-table", header, tuple(rows)),
            Paragraph("The noised and spent columns reveal which answers were noised: keep them from clients.", "note"),
        ),
    )


def _caveats(f: ReportFacts) -> Section:
    return Section(
        "caveats",
        "What is guaranteed, and what is not",
        (
            Heading("The guarantee covers", "covered"),
            Bullets(caveats.covered(f), "covered-list"),
            Heading("It does not cover", "not-covered"),
            Bullets(caveats.not_covered(f), "not-covered-list"),
        ),
    )
