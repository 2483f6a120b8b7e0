import pytest

from openalign.config import ConfigError


def test_class_names_and_templates(tmp_path):
    from openalign.eval.datasets import load_classnames, load_templates

    (tmp_path / "names.txt").write_text("tench\ngoldfish\n")  # one per sorted label
    assert load_classnames(str(tmp_path / "names.txt"), ["n02", "n01"]) == {"n01": "tench", "n02": "goldfish"}
    (tmp_path / "pairs.tsv").write_text("n02\tgoldfish\nn01\ttench\nn03\tshark\n")
    assert load_classnames(str(tmp_path / "pairs.tsv"), ["n01", "n02"])["n02"] == "goldfish"
    assert len(load_templates("imagenet80")) == 80 and load_templates("generic")[0] == "{}"
    with pytest.raises(ConfigError, match="2 names for 3 classes"):
        load_classnames(str(tmp_path / "names.txt"), ["a", "b", "c"])
    for bad in ("a {} and a {}", "a {name}", "a { photo", "no slot"):  # before: "{} {}" raised IndexError when filled
        (tmp_path / "t.txt").write_text(f"a photo of a {{}}\n{bad}\n")
        with pytest.raises(ConfigError, match="must hold {} once"):
            load_templates(str(tmp_path / "t.txt"))
    (tmp_path / "t.txt").write_text("{{literal}} braces around a {}\n")
    assert load_templates(str(tmp_path / "t.txt"))[0].format("cat") == "{literal} braces around a cat"


@pytest.mark.parametrize("name,content", [
    ("SimLex-999.txt", "word1\tword2\tPOS\tSimLex999\tconc(w1)\nold\tnew\tA\t1.58\t2.72\nsmart\tintelligent\tA\t9.2\t1.75\n"),
    ("combined.csv", "Word 1,Word 2,Human (mean)\nold,new,1.58\nsmart,intelligent,9.2\n"),
    ("combined.tab", "Word 1\tWord 2\tHuman (mean)\nold\tnew\t1.58\nsmart\tintelligent\t9.2\n"),
    ("MEN_dataset_natural_form_full", "old new 1.58\nsmart intelligent 9.2\n"),
    ("MEN_dataset_lemma_form_full", "old-j new-j 1.58\nsmart-j intelligent-j 9.2\n"),
    ("rw.txt", "old\tnew\t1.58\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\nsmart\tintelligent\t9.2\t9\t9\t9\t9\t9\t9\t9\t9\t9\t9\n"),
])
def test_word_similarity_sets_are_read_as_released(tmp_path, name, content):
    # Before: only the SimLex column names were accepted, and .tab files were split on commas
    from openalign.eval.datasets import word_pairs

    (tmp_path / name).write_text(content)
    assert word_pairs(tmp_path / name) == [("old", "new", 1.58), ("smart", "intelligent", 9.2)]


SIMLEX_HEADER = "word1\tword2\tPOS\tSimLex999\tconc(w1)\tconc(w2)\tconcQ\tAssoc(USF)\tSimAssoc333\tSD(SimLex)\n"


def test_simlex_sub_tasks_follow_the_pos_concreteness_and_association_columns(tmp_path):
    from openalign.eval.datasets import SIMLEX_SUBTASKS, word_pair_table

    rows = [("old", "new", "A", "1.58", "1", "0"), ("smart", "intelligent", "A", "9.2", "2", "1"),
            ("cup", "mug", "N", "8.1", "4", "1"), ("run", "walk", "V", "6.0", "3", "0"),
            ("bad", "row", "N", "x", "4", "1"),  # no score: not a pair, and no sub-task holds it
            ("take", "give", "V", "1.2", "1", "1")]
    (tmp_path / "SimLex-999.txt").write_text(SIMLEX_HEADER + "".join(
        f"{a}\t{b}\t{pos}\t{score}\t3.0\t3.0\t{q}\t0.5\t{hard}\t1.0\n" for a, b, pos, score, q, hard in rows))
    pairs, groups = word_pair_table(tmp_path / "SimLex-999.txt")
    assert [p[:2] for p in pairs] == [("old", "new"), ("smart", "intelligent"), ("cup", "mug"), ("run", "walk"),
                                      ("take", "give")]
    assert tuple(groups) == SIMLEX_SUBTASKS  # all nine, in the paper's order
    assert groups == {"all": [0, 1, 2, 3, 4], "adjectives": [0, 1], "nouns": [2], "verbs": [3, 4],
                      "conc_q1": [0, 4], "conc_q2": [1], "conc_q3": [3], "conc_q4": [2], "hard": [1, 2, 4]}
    (tmp_path / "combined.csv").write_text("Word 1,Word 2,Human (mean)\nold,new,1.58\n")
    assert word_pair_table(tmp_path / "combined.csv")[1] == {}  # WordSim-353 has no sub-tasks


def test_numeric_class_folders_take_their_names_in_numeric_order(tmp_path):
    # Before: labels `0..N` were matched to classnames.txt in string order (`10` before `2`): top-1 silently wrong.
    from openalign.eval.datasets import load_classnames

    names = [f"class number {i}" for i in range(12)]
    (tmp_path / "classnames.txt").write_text("\n".join(names) + "\n")  # CLIP_benchmark: one name per class index
    labels = [str(i) for i in range(12)] * 2
    assert load_classnames(str(tmp_path / "classnames.txt"), labels) == {str(i): names[i] for i in range(12)}
    from openalign.eval.datasets import label_order

    assert label_order(["b", "a", "10"]) == ["10", "a", "b"]  # not all numbers: alphabetical, as before
