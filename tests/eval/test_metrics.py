import pytest
import torch

from openalign.eval import metrics as M


def test_recalls_on_a_hand_built_similarity_matrix():
    # 3 images, 5 captions: image 0 owns captions 0,1; image 1 owns 2,3; image 2 owns 4.
    img = torch.eye(3)
    txt = torch.tensor([[0.9, 0.0, 0.0],   # cap 0 -> image 0 best
                        [0.1, 0.2, 0.0],   # cap 1 -> image 1 best (wrong), image 0 second
                        [0.0, 0.1, 0.5],   # cap 2 -> image 2 best (wrong), image 1 second
                        [0.0, 0.3, 0.0],   # cap 3 -> image 1 best
                        [0.0, 0.0, 0.4]])  # cap 4 -> image 2 best
    owner = torch.tensor([0, 0, 1, 1, 2])
    # image->text: image 0 scores caps [.9,.1,0,0,0] -> best own .9 rank 0
    #              image 1 scores [0,.2,.1,.3,0] -> best own .3 (cap 3) rank 0
    #              image 2 scores [0,0,.5,0,.4] -> own .4, cap 2 (.5) beats it -> rank 1
    assert M.i2t_ranks(img, txt, owner).tolist() == [0, 0, 1]
    # text->image: cap0 rank 0, cap1 rank 1, cap2 rank 1, cap3 rank 0, cap4 rank 0
    assert M.t2i_ranks(img, txt, owner).tolist() == [0, 1, 1, 0, 0]
    m = M.retrieval_metrics(img, txt, owner)
    assert m["i2t_r1"] == pytest.approx(2 / 3) and m["i2t_r5"] == 1.0
    assert m["t2i_r1"] == pytest.approx(3 / 5) and m["t2i_r10"] == 1.0
    assert m["mean_recall"] == pytest.approx((2 / 3 + 1 + 1 + 3 / 5 + 1 + 1) / 6)
    assert (m["n_images"], m["n_texts"]) == (3, 5)
    assert m["i2t_median_rank"] == 1.0 and m["t2i_median_rank"] == 1.0


def test_ties_count_against_the_query():
    img = torch.ones(2, 1)
    txt = torch.ones(2, 1)  # every score ties
    owner = torch.tensor([0, 1])
    assert M.i2t_ranks(img, txt, owner).tolist() == [1, 1]
    assert M.t2i_ranks(img, txt, owner).tolist() == [1, 1]


def test_chunking_does_not_change_ranks():
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(37, 8, generator=g), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(90, 8, generator=g), dim=-1)
    owner = torch.randint(0, 37, (90,), generator=g)
    assert torch.equal(M.i2t_ranks(img, txt, owner, chunk=5), M.i2t_ranks(img, txt, owner, chunk=1000))
    assert torch.equal(M.t2i_ranks(img, txt, owner, chunk=7), M.t2i_ranks(img, txt, owner, chunk=1000))


def test_chance_levels():
    owner = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])  # 4 images x 2 captions
    chance = M.retrieval_chance(owner, 4, ks=(1, 2))
    assert chance["i2t_r1"] == pytest.approx(2 / 8)
    assert chance["i2t_r2"] == pytest.approx(1 - (6 / 8) * (5 / 7))
    assert chance["t2i_r1"] == pytest.approx(1 / 4)


def test_prompt_ensemble_normalizes_each_template_then_the_mean():
    # class 0: templates (2, 0) and (0, 1) -> normalized (1, 0), (0, 1) -> mean (.5, .5) -> (0.707, 0.707)
    embeds = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 3.0], [0.0, 1.0]])
    w = M.class_weights(embeds, 2)
    torch.testing.assert_close(w, torch.tensor([[2 ** -0.5, 2 ** -0.5], [0.0, 1.0]]))


def test_topk_accuracy_with_ties_against():
    logits = torch.tensor([[0.9, 0.1, 0.0], [0.5, 0.5, 0.0], [0.1, 0.2, 0.3]])
    labels = torch.tensor([0, 1, 0])
    acc = M.topk_accuracy(logits, labels, ks=(1, 2))
    assert acc["top1"] == pytest.approx(1 / 3)  # row 1 ties: counted as a miss at top-1
    assert acc["top2"] == pytest.approx(2 / 3)


def full_matrix_ranks(img, txt, text_to_image, sims=None):
    """The naive reference: the whole [N, M] matrix, ranks by the definition in the module docstring."""
    sims = img @ txt.T if sims is None else sims
    own = text_to_image[None, :] == torch.arange(img.shape[0])[:, None]
    best = sims.masked_fill(~own, float("-inf")).max(dim=1, keepdim=True).values
    i2t = ((sims >= best) & ~own).sum(dim=1)
    score = sims.T.gather(1, text_to_image[:, None])
    t2i = (sims.T >= score).sum(dim=1) - 1
    return i2t, t2i


def test_blocked_ranks_equal_the_full_matrix_with_shuffled_captions_and_ties():
    g = torch.Generator().manual_seed(0)
    img = torch.randint(-2, 3, (37, 8), generator=g).double()  # small integers: many exact ties
    owner = torch.cat([torch.arange(37).repeat_interleave(3), torch.tensor([0, 5, 5])])  # 3-5 captions each
    owner = owner[torch.randperm(len(owner), generator=g)]  # captions in no particular order
    txt = torch.randint(-2, 3, (len(owner), 8), generator=g).double()
    ref_i2t, ref_t2i = full_matrix_ranks(img, txt, owner)
    for chunk in (None, 1, 5, 64):
        assert torch.equal(M.i2t_ranks(img, txt, owner, chunk), ref_i2t)
        assert torch.equal(M.t2i_ranks(img, txt, owner, chunk), ref_t2i)
        one_pass = M.retrieval_ranks(img, txt, owner, chunk)
        assert torch.equal(one_pass[0], ref_i2t) and torch.equal(one_pass[1], ref_t2i)


def test_one_pass_ranks_settle_near_ties_by_the_gemm_values():
    # float32 embeddings whose own-image scores a plain dot product rounds differently from the GEMM, with
    # duplicated images and captions (exact ties) and near-duplicates one rounding step apart
    g = torch.Generator().manual_seed(1)
    img = torch.nn.functional.normalize(torch.randn(60, 48, generator=g), dim=1)
    img[30:40] = img[:10]
    img[40:50] = img[:10] + 1e-7 * torch.randn(10, 48, generator=g)
    owner = torch.arange(60).repeat_interleave(3)[torch.randperm(180, generator=g)]
    txt = torch.nn.functional.normalize(img[owner] + 0.05 * torch.randn(180, 48, generator=g), dim=1)
    txt[90:] = txt[:90]
    for chunk in (None, 7):
        # the same scores as the pass sees them: a GEMM's rounding can depend on the block's shape
        sims = torch.cat([img[s:s + (chunk or 60)] @ txt.T for s in range(0, 60, chunk or 60)])
        ref_i2t, ref_t2i = full_matrix_ranks(img, txt, owner, sims)
        i2t, t2i = M.retrieval_ranks(img, txt, owner, chunk)
        assert torch.equal(i2t, ref_i2t) and torch.equal(t2i, ref_t2i)


def test_captions_by_image_table():
    table = M.captions_by_image(torch.tensor([2, 0, 2, 1, 2]), 4)
    assert table.tolist() == [[1, -1, -1], [3, -1, -1], [0, 2, 4], [-1, -1, -1]]


def test_count_at_least_is_exact_beyond_int16():
    scores = torch.zeros(2, 70_000)
    scores[1, :5] = -1.0
    assert M.count_at_least(scores, torch.tensor([[0.0], [0.0]])).tolist() == [70_000, 69_995]


def test_knn_on_hand_built_embeddings():
    train = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [1.0, 0.0]])
    labels = torch.tensor([0, 1, 1, 2])  # rows 0 and 3 are identical: for [1, 0] a tie, the lower index wins
    test = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]])
    assert M.knn_predict(train, labels, test, k=1).tolist() == [0, 1, 1]  # [0.8, 0.6] is nearest to row 2 (0.96)
    # k=3 for [0.8, 0.6]: neighbours 0 (0.8), 3 (0.8), 2 (0.96) -> votes: class 0 0.8, class 2 0.8, class 1 0.96
    assert M.knn_predict(train, labels, test[2:], k=3).tolist() == [1]
    assert M.knn_predict(train, labels, test, k=1, chunk=1).tolist() == [0, 1, 1]


def test_chance_keys_of_task_prefixed_metrics():
    metrics = {"i2t_r10": 0.3, "chance_i2t_r10": 0.02, "zeroshot_top1": 0.1, "zeroshot_chance_top1": 0.01,
               "linear_probe_top5": 0.5, "linear_probe_chance_top5": 0.05, "knn_top1": 0.2}
    assert M.chance_key("i2t_r10", metrics) == "chance_i2t_r10"
    assert M.chance_key("zeroshot_top1", metrics) == "zeroshot_chance_top1"
    assert M.chance_key("linear_probe_top5", metrics) == "linear_probe_chance_top5"
    assert M.chance_key("knn_top1", metrics) is None  # no chance level written: none shown


def test_chance_keys_of_a_corpus_held_out_split():
    """data.corpus=emoji+openclipart: each source's metrics are NAME/... with their chance levels NAME/chance_..."""
    metrics = {"openclipart/i2t_r10": 0.6, "openclipart/chance_i2t_r10": 0.019, "chance_i2t_r10": 0.01}
    assert M.chance_key("openclipart/i2t_r10", metrics) == "openclipart/chance_i2t_r10"
    assert M.chance_key("i2t_r10", metrics) == "chance_i2t_r10"
    assert M.is_chance("openclipart/chance_i2t_r10") and not M.is_chance("openclipart/i2t_r10")


def test_a_new_tasks_chance_keys_need_no_registration():
    # Before: chance keys came from a list of task prefixes in metrics.py; a task added to eval/tasks.py without
    # a line there had its chance level looked up at `chance_newtask_top1` and never shown.
    from openalign.eval.report import metric_lines

    metrics = {"new_task_top1": 0.4, "new_task_chance_top1": 0.1}
    assert M.chance_key("new_task_top1", metrics) == "new_task_chance_top1"
    assert [line.split() for line in metric_lines(metrics)] == [["new_task_top1", "0.4000", "(chance", "0.1000,", "4.0x)"]]


def test_intra_modal_ranks_leave_the_query_out_and_take_the_best_positive():
    # 4 items on a line; each query's similarity to item j is -|i - j| (itself scores 0, the best)
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    sims = -(x - x.T).abs()
    queries, table = M.pair_positives([(0, 3), (0, 2), (0, 3), (2, 1), (7, 0)], n_queries=4)
    assert queries.tolist() == [0, 2] and table.tolist() == [[3, 2], [1, -1]]  # duplicates once, out-of-range dropped
    # query 0: without itself, item 1 (-1) beats its best positive 2 (-2) -> rank 1; query 2: items 1, 3 tie
    # at -1 and the wrong one counts against it -> rank 1; with the query not left out, it beats all -> +1
    ranks = M.positive_ranks(sims[queries], torch.eye(4), table, exclude=queries)
    assert ranks.tolist() == [1, 1]
    assert M.positive_ranks(sims[queries], torch.eye(4), table).tolist() == [2, 2]
    blocked = M.positive_ranks(sims[queries], torch.eye(4), table, exclude=queries, chunk=1)
    assert blocked.tolist() == [1, 1]


def test_modality_gap_and_cones_equal_their_definitions():
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(50, 8, generator=g, dtype=torch.float64) + 2.0, dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(70, 8, generator=g, dtype=torch.float64) - 1.0, dim=-1)
    out = M.modality_gap(img, txt)

    def cone(x):  # the mean cosine over ordered pairs of different rows, from the full matrix
        sims = x @ x.T
        return float((sims.sum() - sims.diagonal().sum()) / (len(x) * (len(x) - 1)))

    assert out["modality_gap"] == pytest.approx(float((img.mean(0) - txt.mean(0)).norm()))
    assert out["image_cone"] == pytest.approx(cone(img)) and out["text_cone"] == pytest.approx(cone(txt))
    same = M.modality_gap(img, img)
    assert same["modality_gap"] == pytest.approx(0.0, abs=1e-12)


def test_shared_captions_are_texts_of_more_than_one_image_and_get_a_caveat():
    from openalign.eval.report import caveats, metric_lines

    captions = ["a red star", "A  red star", "a blue cat", "a blue cat", "green"]
    text_to_image = torch.tensor([0, 1, 2, 2, 3])  # image 2's two captions are the same text: not shared
    assert M.shared_caption_share(captions, text_to_image) == 2 / 5
    assert M.shared_caption_share([], torch.tensor([], dtype=torch.long)) == 0.0
    lines = metric_lines({"mean_recall": 0.1, "shared_captions": 0.4})
    assert lines[-1].startswith("  note: 40% of the captions are also captions of other images")
    assert caveats({"shared_captions": 0.05}) == [] and caveats({}) == []


NAN = float("nan")


def test_nan_logits_are_misses_not_hits():
    # Before the fix: logits >= true is all False for NaN, the rank is -1, and every row counted as a hit.
    m = M.topk_accuracy(torch.full((4, 10), NAN), torch.tensor([0, 1, 2, 3]))
    assert m == {"top1": 0.0, "top5": 0.0}
    # a finite true logit beaten only by a NaN wrong one: the NaN counts against (rank 1, not 0)
    logits = torch.tensor([[2.0, NAN, 0.0], [2.0, 0.0, 0.0], [float("inf"), 1.0, 0.0]])
    m = M.topk_accuracy(logits, torch.tensor([0, 0, 0]), ks=(1, 2))
    # row 0: rank 1 (NaN counts); row 1: rank 0; row 2: the true logit is inf -> a miss at every K
    assert m == {"top1": pytest.approx(1 / 3), "top2": pytest.approx(2 / 3)}


def test_nan_embeddings_are_misses_in_retrieval():
    img = torch.eye(3)
    txt = torch.eye(3).clone()
    txt[1] = NAN  # caption 1 (of image 1) diverged
    owner = torch.tensor([0, 1, 2])
    assert M.t2i_ranks(img, txt, owner).tolist() == [0, M.MISS, 0]
    # image 1's only caption scores NaN: a miss; images 0 and 2 see a NaN wrong caption, which counts against
    assert M.i2t_ranks(img, txt, owner).tolist() == [1, M.MISS, 1]
    m = M.retrieval_metrics(img, txt, owner)
    assert m["t2i_r10"] == pytest.approx(2 / 3) and m["i2t_r1"] == 0.0 and m["i2t_r10"] == pytest.approx(2 / 3)
    all_nan = M.retrieval_metrics(torch.full((3, 3), NAN), torch.full((3, 3), NAN), owner)
    assert all_nan["mean_recall"] == 0.0 and all_nan["i2t_median_rank"] == float("inf")


def test_knn_never_predicts_from_a_nan_similarity():
    train = torch.tensor([[1.0, 0.0], [0.0, 1.0], [NAN, NAN]])
    labels = torch.tensor([0, 1, 2])
    test = torch.tensor([[0.9, 0.1], [NAN, 0.0], [0.1, 0.9]])
    # query 1 has no finite similarity: -1 (no label); the NaN training item never becomes a neighbour
    assert M.knn_predict(train, labels, test, k=1).tolist() == [0, -1, 1]
    assert M.knn_predict(train, labels, test, k=3, n_classes=3).tolist() == [0, -1, 1]


def test_permuted_labels_fall_to_chance():
    # Well separated classes: a probe and KNN learn them; scored against permuted test labels they must fail.
    g = torch.Generator().manual_seed(0)
    centres = torch.nn.functional.normalize(torch.randn(5, 16, generator=g), dim=-1) * 4
    y = torch.arange(100) % 5
    x = torch.nn.functional.normalize(centres[y] + 0.1 * torch.randn(100, 16, generator=g), dim=-1).double()
    permuted = (y + 1) % 5  # every test image labelled as the next class
    from openalign.eval.probes import linear_probe

    assert linear_probe(x[:50], y[:50], x[50:], y[50:])["top1"] == 1.0
    assert linear_probe(x[:50], y[:50], x[50:], permuted[50:])["top1"] == 0.0
    assert float((M.knn_predict(x[:50], y[:50], x[50:]) == permuted[50:]).float().mean()) == 0.0


def test_expected_calibration_error_equals_a_hand_computed_case():
    # top probabilities 0.9, 0.9, 0.62 and 0.35, in the 15 bins of width 1/15: 0.9 -> bin 13 (13.5), 0.62 -> bin 9
    # (9.3), 0.35 -> bin 5 (5.25). Right: yes, no, yes, no. ECE = 2/4 |0.5 - 0.9| + 1/4 |1 - 0.62| + 1/4 |0 - 0.35|
    import math

    two = lambda p: [math.log(p / (1 - p)), 0.0, -math.inf]  # noqa: E731 - class 0 with probability p
    logits = torch.tensor([two(0.9), two(0.9), two(0.62), [math.log(0.3), math.log(0.35), math.log(0.35)]],
                          dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 0])  # the 4th predicts class 1 (the first of the tie at 0.35): wrong
    out = M.reliability(logits, labels)
    assert out["ece"] == pytest.approx(2 / 4 * 0.4 + 1 / 4 * 0.38 + 1 / 4 * 0.35, abs=1e-12)
    assert [out["count"][i] for i in (13, 9, 5)] == [2, 1, 1] and sum(out["count"]) == 4
    assert out["accuracy"][13] == 0.5 and out["confidence"][9] == pytest.approx(0.62)
    assert math.isnan(out["accuracy"][0])  # an empty bin has no accuracy


def test_temperature_scaling_recovers_a_known_temperature():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(20_000, 10, generator=g, dtype=torch.float64) * 2
    labels = torch.distributions.Categorical(logits=base).sample()  # labels drawn from softmax(base)
    # logits that are 4x too confident: the fitted temperature is 4 (up to sampling noise)
    assert M.fit_temperature(4.0 * base, labels) == pytest.approx(4.0, rel=0.03)
    assert M.nll(base, labels) < M.nll(4.0 * base, labels)
    assert M.reliability(base, labels)["ece"] < 0.02 < M.reliability(4.0 * base, labels)["ece"]


def test_the_sigmoid_head_scores_each_image_class_pair_on_its_own():
    # SigLIP's probabilities: sigmoid of each pair's logit, a row need not sum to 1; confidence is the top pair's
    import math

    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    logits = torch.tensor([[logit(0.9), logit(0.8)], [logit(0.3), logit(0.2)], [logit(0.55), logit(0.6)]],
                          dtype=torch.float64)
    labels = torch.tensor([0, 1, 0])  # right, wrong, wrong
    probs = M.probabilities(logits, "sigmoid")
    torch.testing.assert_close(probs, torch.tensor([[0.9, 0.8], [0.3, 0.2], [0.55, 0.6]], dtype=torch.float64))
    # confidences 0.9 (right), 0.3 (wrong), 0.6 (wrong): ECE = 1/3 (|1 - 0.9| + |0 - 0.3| + |0 - 0.6|)
    assert M.reliability(logits, labels, head="sigmoid")["ece"] == pytest.approx((0.1 + 0.3 + 0.6) / 3, abs=1e-12)
    # NLL: every pair's answer, summed over the classes, averaged over the images
    pair_nll = -(math.log(0.9) + math.log(0.2) + math.log(0.7) + math.log(0.2) + math.log(0.55) + math.log(0.4)) / 3
    assert M.nll(logits, labels, "sigmoid") == pytest.approx(pair_nll, abs=1e-12)
    assert M.nll(logits, labels) != pytest.approx(pair_nll)  # the softmax head's is another number


def test_sigmoid_scaling_finds_the_temperature_and_bias_that_minimize_the_pair_nll():
    g = torch.Generator().manual_seed(0)
    cosines = torch.rand(400, 6, generator=g, dtype=torch.float64) * 0.4
    labels = cosines.argmax(dim=1)
    flip = torch.rand(400, generator=g) < 0.3  # some wrong, so the optimum is finite
    labels[flip] = torch.randint(0, 6, (int(flip.sum()),), generator=g)
    t, b = M.fit_sigmoid(cosines, labels, temperature=0.1, bias=-10.0)
    best = M.nll(cosines / t + b, labels, "sigmoid")
    for dt, db in ((1.02, 0), (0.98, 0), (1, 0.05), (1, -0.05)):
        assert best < M.nll(cosines / (t * dt) + b + db, labels, "sigmoid")
    assert best < M.nll(cosines / 0.1 - 10.0, labels, "sigmoid")


def brute_best_threshold(scores: list[float], positive: list[bool]) -> tuple[float, float]:
    """Every distinct score as a cut, highest first; the first best J wins; the threshold is the midpoint
    to the next lower distinct score (or the cut minus 1 below the lowest)."""
    levels = sorted(set(scores), reverse=True)
    p, n = sum(positive), len(positive) - sum(positive)
    best = None
    for i, level in enumerate(levels):
        tp = sum(s >= level and y for s, y in zip(scores, positive))
        fp = sum(s >= level and not y for s, y in zip(scores, positive))
        lower = levels[i + 1] if i + 1 < len(levels) else level - 1.0
        if best is None or tp * n - fp * p > best[2]:  # exact: J = tp/p - fp/n
            best = ((level + lower) / 2, tp / p - fp / n, tp * n - fp * p)
    return best[:2]


def test_per_query_thresholds_and_their_spread_equal_a_brute_force_oracle():
    g = torch.Generator().manual_seed(3)
    scores = torch.randint(0, 6, (40, 9), generator=g).double() / 5  # coarse: many ties
    positive = torch.rand(40, 9, generator=g) < 0.3
    positive[:, 0], positive[:, 1] = True, False  # every row has a match and a non-match
    t, j = M.best_thresholds(scores, positive)
    for row in range(40):
        bt, bj = brute_best_threshold(scores[row].tolist(), positive[row].tolist())
        assert (float(t[row]), float(j[row])) == pytest.approx((bt, bj), abs=1e-12), row
    # the spread: i2t and t2i of a toy set, and a shared threshold never beats each query's own
    img = torch.nn.functional.normalize(torch.randn(12, 6, generator=g), dim=-1)
    txt = torch.nn.functional.normalize(img.repeat_interleave(2, 0) + 0.3 * torch.randn(24, 6, generator=g), dim=-1)
    owner = torch.arange(12).repeat_interleave(2)
    out = M.threshold_spread(img, txt, owner, chunk=5)
    expected = [brute_best_threshold((img[q] @ txt.T).tolist(), (owner == q).tolist())[0] for q in range(12)]
    assert out["i2t_threshold_std"] == pytest.approx(float(torch.tensor(expected).std(unbiased=False)), abs=1e-6)
    assert out["i2t_youden_shared"] <= out["i2t_youden_own"] + 1e-12
    assert out["t2i_youden_shared"] <= out["t2i_youden_own"] + 1e-12 and out["t2i_threshold_iqr"] >= 0


def test_reranked_ranks_equal_the_position_in_the_two_stage_list():
    g = torch.Generator().manual_seed(6)
    queries = torch.nn.functional.normalize(torch.randn(30, 8, generator=g), dim=-1)
    gallery = torch.nn.functional.normalize(torch.randn(50, 8, generator=g), dim=-1)
    late = torch.randn(30, 50, generator=g)  # any second-stage score
    positives = torch.full((30, 2), -1, dtype=torch.long)
    positives[:, 0] = torch.randint(0, 50, (30,), generator=g)
    positives[::3, 1] = torch.randint(0, 50, (10,), generator=g)  # some queries have two positives
    pooled = M.positive_ranks(queries, gallery, positives)
    got = M.reranked_ranks(queries, gallery, positives, pooled, lambda rows, top: late[rows[:, None], top], k=7, chunk=4)
    for q in range(30):  # the final list: the top 7 by pooled score in late order, then the rest in pooled order
        order = (queries[q] @ gallery.T).argsort(descending=True).tolist()
        final = sorted(order[:7], key=lambda i: -late[q, i].item()) + order[7:]
        wanted = {i for i in positives[q].tolist() if i >= 0}
        assert got[q].item() == min(final.index(i) for i in wanted), q
    assert (got != pooled).any() and (got[pooled >= 7] == pooled[pooled >= 7]).all()
