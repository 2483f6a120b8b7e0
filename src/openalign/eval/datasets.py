"""The evaluation suite's own file formats: prompt templates, class-name lists and word-similarity sets.

Images and captions of every layout (shards, Karpathy JSON, caption and label tables, class folders,
Multi30k lists) are read by data/sources.py. The paper's protocols are the Karpathy test splits:
Flickr30K 1K test images and MSCOCO 5K test images, 5 captions each (`--split test`).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from openalign.config import ConfigError

TEMPLATE_SETS = ("imagenet80", "generic")  # shipped in eval/templates/: CLIP's 80 ImageNet prompts, a short set


def load_templates(spec: str) -> tuple[str, ...]:
    """A shipped template set by name, or a file with one template per line: `{}` where the class name goes, or
    `{c}` (CLIP_benchmark's zeroshot_classification_templates.txt), read as `{}`."""
    path = Path(__file__).parent / "templates" / f"{spec}.txt" if spec in TEMPLATE_SETS else Path(spec)
    if not path.is_file():
        raise ConfigError(f"no templates file {spec}; give a file or one of {', '.join(TEMPLATE_SETS)}")
    templates = tuple(t.strip().replace("{c}", "{}") for t in path.read_text(encoding="utf-8-sig").splitlines()
                      if t.strip())
    if not templates:
        raise ConfigError(f"{spec} holds no templates: one per line, with {{}} where the class name goes")
    return check_templates(templates, f"line of {spec}")


def check_templates(templates, where: str = "template") -> tuple[str, ...]:
    """Templates that each take the class name once, as `{}` (`{0}` too); any other brace ("{} {}", "{name}", a
    lone "{") is one sentence that names the template, not an IndexError when it is filled in."""
    templates = tuple(templates)
    for template in templates:
        try:
            ok = isinstance(template, str) and "\0" in template.format("\0")
        except (IndexError, KeyError, ValueError):
            ok = False
        if not ok:
            raise ConfigError(f"the {where} {str(template)[:80]!r} must hold {{}} once where the class name goes (a "
                              "literal brace is written {{ or }})")
    return templates


def label_order(labels) -> list[str]:
    """The distinct labels in class order: numerically when every label is a number (CLIP_benchmark's class
    folders `0 .. N-1`, whose classnames.txt lists names in that order: `10` after `9`, not after `1`), else
    alphabetically (ImageNet's sorted WordNet ids)."""
    distinct = set(labels)
    if distinct and all(label.isdigit() for label in distinct):
        return sorted(distinct, key=int)
    return sorted(distinct)


def load_classnames(path: str, labels: list[str]) -> dict[str, str]:
    """Readable class names: `label<TAB or ,>name` lines; or one name per line, by class index when the labels are
    indices (CLIP_benchmark's classnames.txt and `.cls` labels: a split may hold only some of the classes), else in
    sorted-label order (the convention of ImageNet class-name lists aligned with sorted WordNet ids)."""
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    pairs = [re.split(r"[\t,]", line, maxsplit=1) for line in lines]
    if all(len(p) == 2 for p in pairs) and {p[0] for p in pairs} >= set(labels):
        return {p[0]: p[1].strip() for p in pairs}
    if labels and all(label.isdigit() and int(label) < len(lines) for label in labels):
        return {label: lines[int(label)] for label in labels}
    ordered = label_order(labels)
    if len(lines) != len(ordered):
        raise ConfigError(f"{path} has {len(lines)} names for {len(ordered)} classes; give one per class in sorted "
                          "label order, or `label,name` lines")
    return dict(zip(ordered, lines))


WORD_SCORE_COLUMNS = ("simlex999", "human (mean)", "human(mean)", "score", "similarity", "mean", "sim", "relatedness")
_POS_SUFFIX = re.compile(r"-[nvajr]$")


def word_pairs(path: Path) -> list[tuple[str, str, float]]:
    """(word, word, human score) from the released layouts of the word-similarity sets (`word_pair_table`)."""
    return word_pair_table(path)[0]


SIMLEX_POS = {"A": "adjectives", "N": "nouns", "V": "verbs"}  # SimLex-999's POS column
SIMLEX_SUBTASKS = ("all", "adjectives", "nouns", "verbs", "conc_q1", "conc_q2", "conc_q3", "conc_q4", "hard")


def word_pair_table(path: Path) -> tuple[list[tuple[str, str, float]], dict[str, list[int]]]:
    """(word, word, human score) from the released layouts of the word-similarity sets, recognised by content:
    SimLex-999 (tab-separated, header `word1 word2 POS SimLex999 conc(w1) conc(w2) concQ Assoc(USF) SimAssoc333
    SD(SimLex)`), WordSim-353 (`combined.csv` / `.tab`, header `Word 1,Word 2,Human (mean)`), MEN (space-separated
    `w1 w2 score`, no header; the lemma form's `-n/-v/-j` part-of-speech suffixes are dropped) and Stanford RW
    (tab-separated `w1 w2 score s1 ... s10`). The words are the first two fields; the score is the named score
    column, else the third field.

    Second, the sub-tasks of SimLex-999 that the paper's Appendix B reports, as indices into the pairs: `all`,
    `adjectives`/`nouns`/`verbs` (POS A/N/V), `conc_q1`..`conc_q4` (concQ, the pair's concreteness quartile) and
    `hard` (SimAssoc333 = 1: the 333 most associated pairs), each where the file has its column; {} otherwise."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    if not lines:
        raise ConfigError(f"{path} is empty; give a word-similarity file (SimLex-999, WordSim-353, MEN or RW)")
    delimiter = "\t" if "\t" in lines[0] else "," if "," in lines[0] else None
    rows = [next(csv.reader([line], delimiter=delimiter)) if delimiter else line.split() for line in lines]
    rows = [[field.strip() for field in row] for row in rows]

    def number(text: str) -> bool:
        try:
            float(text)
            return True
        except ValueError:
            return False

    header = not any(number(field) for field in rows[0])
    score, names = 2, []
    if header:
        names = [field.lower() for field in rows[0]]
        score = next((names.index(n) for n in WORD_SCORE_COLUMNS if n in names), 2)
        rows = rows[1:]
    pairs, kept, bad = [], [], 0
    for row in rows:
        if len(row) <= score or not number(row[score]):
            bad += 1
            continue
        pairs.append((row[0], row[1], float(row[score])))
        kept.append(row)
    if not pairs:
        raise ConfigError(f"{path} has no `word word score` rows (SimLex-999, WordSim-353, MEN or RW layouts)")
    if bad > len(pairs):
        raise ConfigError(f"{path}: {bad} of {bad + len(pairs)} rows have no number as their score; is it a "
                          "word-similarity file?")
    if all(_POS_SUFFIX.search(a) and _POS_SUFFIX.search(b) for a, b, _ in pairs):  # MEN's lemma form: sun-n
        pairs = [(_POS_SUFFIX.sub("", a), _POS_SUFFIX.sub("", b), s) for a, b, s in pairs]
    return pairs, _simlex_subtasks(names, kept)


def _simlex_subtasks(names: list[str], rows: list[list[str]]) -> dict[str, list[int]]:
    column = lambda name: names.index(name) if name in names else None  # noqa: E731
    pos, quartile, hard = column("pos"), column("concq"), column("simassoc333")
    if pos is None and quartile is None and hard is None:
        return {}
    value = lambda row, i: row[i] if i is not None and i < len(row) else ""  # noqa: E731
    groups: dict[str, list[int]] = {"all": list(range(len(rows)))}
    if pos is not None:
        for tag, name in SIMLEX_POS.items():
            groups[name] = [i for i, row in enumerate(rows) if value(row, pos).upper() == tag]
    if quartile is not None:
        for q in range(1, 5):
            groups[f"conc_q{q}"] = [i for i, row in enumerate(rows) if value(row, quartile) in (str(q), f"{q}.0")]
    if hard is not None:
        groups["hard"] = [i for i, row in enumerate(rows) if value(row, hard) in ("1", "1.0")]
    return {name: groups[name] for name in SIMLEX_SUBTASKS if name in groups}
