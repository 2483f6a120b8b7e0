"""Text-only tasks: the Spearman correlation of the text tower's cosines with human similarity scores (word-sim:
SimLex-999, WordSim-353, MEN, RW; sts: sentence pairs)."""

from __future__ import annotations

from pathlib import Path

from openalign.config import ConfigError
from openalign.data import tables
from openalign.eval.datasets import word_pair_table
from openalign.eval.features import Context

__all__ = ["sts", "text_pair_similarity", "word_sim"]


PAIR_COLUMNS = {  # text-only tasks: (first text, second text, candidate score columns)
    "sts": ("sentence1", "sentence2", ("score", "similarity")),  # STS / Crisscrossed-Captions STS layout
}


def text_pair_similarity(ctx: Context, task: str) -> dict:
    """Spearman correlation between the model's cosine similarity of two texts and human scores."""
    from scipy.stats import spearmanr

    first, second, score_names = PAIR_COLUMNS[task]
    path = ctx.path
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--task {task} needs --data FILE (a CSV/TSV with {first}, {second} and a score)")
    rows = tables.dicts(file, "\t" if file.suffix in (".tsv", ".txt") else ",")
    score = next((c for c in score_names if rows and c in rows[0]), None)
    if not rows or first not in rows[0] or second not in rows[0] or score is None:
        raise ConfigError(f"{path} needs the columns {first}, {second} and one of {', '.join(score_names)}")
    texts = sorted({r[first] for r in rows} | {r[second] for r in rows})
    index = {t: i for i, t in enumerate(texts)}
    embeds = ctx.encode(texts)
    a = embeds[[index[r[first]] for r in rows]]
    b = embeds[[index[r[second]] for r in rows]]
    cosine = (a * b).sum(dim=1).tolist()
    human = [float(r[score]) for r in rows]
    return {"spearman": float(spearmanr(cosine, human).statistic), "n_pairs": len(rows)}


def word_sim(ctx: Context, _=None) -> tuple[dict, dict]:
    """Spearman correlation on the pairs the vocabulary covers: a word whose pieces are all [UNK] has no
    embedding of its own (every such word embeds alike), so its pairs are reported, not scored. A SimLex-999 file
    with its POS, concQ and SimAssoc333 columns also gives the paper's Appendix B sub-tasks (`spearman_nouns`,
    `spearman_conc_q1`, `spearman_hard`, ...: eval/datasets.SIMLEX_SUBTASKS), each on its covered pairs."""
    from scipy.stats import spearmanr

    path, tokenizer = ctx.path, ctx.tokenizer
    file = Path(path)
    if not file.is_file():
        raise ConfigError("--task word-sim needs --data FILE (SimLex-999, WordSim-353, MEN or RW, as released)")
    pairs, subtasks = word_pair_table(file)
    words = sorted({w for a, b, _ in pairs for w in (a, b)})
    unk = tokenizer.unk_token_id
    known = {w for w, ids in zip(words, tokenizer(words, add_special_tokens=False)["input_ids"])
             if any(i != unk for i in ids)}
    covered = [i for i, (a, b, _) in enumerate(pairs) if a in known and b in known]
    out = {"n_pairs": len(pairs), "n_covered": len(covered), "n_out_of_vocabulary": len(pairs) - len(covered)}
    if len(covered) < 2:
        raise ConfigError(f"only {len(covered)} of the {len(pairs)} pairs of {path} have words the tokenizer knows "
                          "(all-[UNK] words are not a measurement); the model's vocabulary does not cover this set")
    index = {w: i for i, w in enumerate(sorted({w for i in covered for w in pairs[i][:2]}))}
    embeds = ctx.encode(index)
    cosine = {i: float(embeds[index[pairs[i][0]]] @ embeds[index[pairs[i][1]]]) for i in covered}

    def spearman(rows: list[int]) -> float:
        return float(spearmanr([cosine[i] for i in rows], [pairs[i][2] for i in rows]).statistic)

    out["spearman"] = spearman(covered)
    for name, rows in subtasks.items():
        scored = [i for i in rows if i in cosine]
        if name != "all" and len(scored) >= 2:
            out[f"spearman_{name}"] = spearman(scored)
            out[f"n_covered_{name}"] = len(scored)
    return out, {}


def sts(ctx: Context, _=None) -> tuple[dict, dict]:
    return text_pair_similarity(ctx, "sts"), {}
