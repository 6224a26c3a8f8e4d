"""Visual rewards: IoU/GIoU and coordinate spaces, detection, counting, temporal, tracking, GUI (values by hand)."""

import math

import pytest
import torch
from PIL import Image

from mmgrpo.rewards import (
    BoxSpace,
    ImageGeometry,
    box_giou,
    box_iou,
    convert_coords,
    count_exact,
    count_fuzzy,
    detection_visual_rft,
    detection_weighted,
    giou,
    gui_point_distance,
    gui_point_in_box,
    iou,
    multi_span_iou,
    span_iou,
    temporal_iou,
    to_normalized,
    tracking_iou,
)
from mmgrpo.rewards.visual import merge_spans, parse_detections, visual_rft_score, weighted_detection_score


def ans(x: str) -> str:
    return f"<think>t</think><answer>{x}</answer>"


# --- IoU / GIoU ------------------------------------------------------------------------------------------


def test_box_iou_giou_worked_by_hand():
    a, b = [0, 0, 2, 2], [1, 1, 3, 3]
    assert box_iou(a, b) == pytest.approx(1 / 7)  # intersection 1, union 4 + 4 - 1
    assert box_giou(a, b) == pytest.approx(1 / 7 - 2 / 9)  # hull 9
    assert box_iou([0, 0, 1, 1], [2, 0, 3, 1]) == 0.0
    assert box_giou([0, 0, 1, 1], [2, 0, 3, 1]) == pytest.approx(-1 / 3)  # hull 3, union 2
    assert box_iou(a, a) == 1.0 and box_giou(a, a) == 1.0


def test_box_iou_edge_cases():
    assert box_iou([1, 1, 1, 1], [1, 1, 1, 1]) == 0.0  # zero union, no division by zero
    assert box_giou([1, 1, 1, 1], [1, 1, 1, 1]) == 0.0  # zero hull
    assert box_iou([2, 0, 0, 2], [0, 0, 2, 2]) == 0.0  # x2 < x1: malformed
    assert box_giou([2, 0, 0, 2], [0, 0, 2, 2]) == -1.0
    assert box_iou([0, 0, math.nan, 1], [0, 0, 1, 1]) == 0.0
    assert box_iou([0, 0, 1], [0, 0, 1, 1]) == 0.0


def test_coordinate_spaces_convert_to_a_common_space():
    geo = ImageGeometry(image_size=(1000, 500), grid_thw=(1, 20, 40))  # resized W = 40·14 = 560, H = 20·14 = 280
    target = [0.1, 0.1, 0.5, 0.5]
    assert to_normalized([100, 50, 500, 250], "original_pixels", geo) == pytest.approx(target)
    assert to_normalized([56, 28, 280, 140], "qwen25vl_abs_resized", geo) == pytest.approx(target)
    assert to_normalized([100, 100, 500, 500], "qwen2vl_0_1000", geo) == pytest.approx(target)
    assert to_normalized([100, 100, 500, 500], BoxSpace.QWEN3VL_0_1000) == pytest.approx(target)
    assert convert_coords([56, 28], "qwen25vl_abs_resized", "original_pixels", geo) == pytest.approx([100, 50])
    with pytest.raises(ValueError, match="needs the image size"):
        to_normalized([1, 2, 3, 4], "original_pixels")
    with pytest.raises(ValueError, match="needs the processor's image_grid_thw"):
        to_normalized([1, 2, 3, 4], "qwen25vl_abs_resized", ImageGeometry(image_size=(10, 10)))
    with pytest.raises(ValueError, match="unknown pred_space 'qwen25'; valid: qwen2vl_0_1000"):
        iou([ans("[1,2,3,4]")], answer=[[1, 2, 3, 4]], pred_space="qwen25", gt_space="normalized_0_1")


def test_iou_reward_with_qwen25vl_grid_and_original_gt():
    image = Image.new("RGB", (1000, 500))
    cols = {
        "answer": [[100, 50, 500, 250]] * 3,
        "image": [image] * 3,
        "image_grid_thw": [torch.tensor([[1, 20, 40]])] * 3,
    }
    c = [ans("[56, 28, 280, 140]"), ans('{"bbox_2d": [56, 28, 168, 140]}'), ans("no box")]
    r = iou(c, prompts=["p"] * 3, pred_space="qwen25vl_abs_resized", gt_space="original_pixels", **cols)
    # second: normalised [0.1, 0.1, 0.3, 0.5] inside [0.1, 0.1, 0.5, 0.5]: half the area -> 0.5
    assert r == pytest.approx([1.0, 0.5, 0.0])
    # the silent failure the explicit spaces prevent: reading resized pixels as original ones
    wrong = iou(c[:1], pred_space="original_pixels", gt_space="original_pixels", **{k: v[:1] for k, v in cols.items()})
    assert wrong[0] < 0.5
    assert iou(c, pred_space="qwen25vl_abs_resized", gt_space="original_pixels", threshold=0.5, **cols) == [
        1.0,
        0.0,
        0.0,
    ]


def test_iou_reward_edge_cases_and_required_spaces():
    with pytest.raises(ValueError, match="pred_space is required.*qwen25vl_abs_resized"):
        iou([ans("[1,2,3,4]")], answer=[[1, 2, 3, 4]], gt_space="normalized_0_1")
    kw = dict(pred_space="qwen2vl_0_1000", gt_space="qwen2vl_0_1000")
    c = [ans("[0, 0, 10, 10]"), ans("[10, 10, 0, 0]"), "", ans("[0,0,10,10]")]
    assert iou(c, answer=["[0,0,10,10]", [0, 0, 10, 10], [0, 0, 10, 10], None], **kw) == [1.0, 0.0, 0.0, None]
    assert iou(
        [ans("[0, 0, 10, 10]")],
        image_size=[(100, 50)],
        answer=[{"bbox": [0, 0, 100, 50]}],
        pred_space="normalized_0_1",
        gt_space="original_pixels",
    ) == [pytest.approx(0.01)]  # GT = whole image: 1/100
    with pytest.raises(ValueError, match="exactly one valid box"):
        iou([ans("[0,0,1,1]")], answer=[[[0, 0, 1, 1], [2, 2, 3, 3]]], **kw)
    assert giou([ans("[0,0,1,1]"), "nothing"], answer=[[2, 0, 3, 1]] * 2, **kw) == pytest.approx([-1 / 3, -1.0])


# --- detection ---------------------------------------------------------------------------------------------

GT2 = [[0, 0, 2, 2], [10, 10, 12, 12]]
KW = dict(pred_space="qwen2vl_0_1000", gt_space="qwen2vl_0_1000")


def test_visual_rft_worked_by_hand():
    pred = (
        "[{'Position': [0, 0, 2, 2], 'Confidence': 0.9}, {'Position': [10, 10, 12, 13], 'Confidence': 0.8},"
        " {'Position': [20, 20, 22, 22], 'Confidence': 0.3}]"
    )
    # IoUs: 1 and 4/6 (matched, > 0.5), 0 (unmatched). R_IoU = (1 + 2/3)/max(2, 3) = 5/9;
    # R_conf = (0.9 + 0.8 + (1 - 0.3))/3 = 0.8
    r = detection_visual_rft([ans(pred)], answer=[GT2], **KW)
    assert r == [pytest.approx(5 / 9 + 0.8)]


def test_visual_rft_edge_cases():
    truncated = '[{"Position": [0, 0, 2, 2], "Confidence": 0.9}, {"Position": [10, 10,'
    c = [ans("[]"), ans("[]"), ans("garbage"), ans(truncated), ans('[{"Position": [0,0,2,2]}]')]
    gt = [[], GT2, GT2, GT2, GT2]
    # both empty: 1 + 1; no prediction: 0; truncated list repaired to its first object: 1/2 + 0.9;
    # no confidence: dropped
    assert detection_visual_rft(c, answer=gt, **KW) == pytest.approx([2.0, 0.0, 0.0, 1.4, 0.0])
    dup = '[{"Position": [0,0,2,2], "Confidence": 1.0}, {"Position": [0,0,2,2], "Confidence": 1.0}]'
    assert len(parse_detections(dup)) == 1
    assert visual_rft_score([{"box": [0, 0, 1, 1], "confidence": 1.5}], [{"box": [5, 5, 6, 6]}]) == (
        0.0,
        0.0,
    )  # c clipped


def test_weighted_detection_worked_by_hand():
    gt = [{"bbox_2d": [0, 0, 2, 2], "label": "cat"}, {"bbox_2d": [10, 10, 12, 12], "label": "dog"}]
    pred = (
        '```json\n[{"bbox_2d": [0, 0, 2, 2], "label": "cat"}, {"bbox_2d": [10, 10, 12, 13], "label": "Cat"},'
        ' {"bbox_2d": [50, 50, 52, 52], "label": "dog"}]\n```'
    )
    # matches: (p0, g0) IoU 1 same label; (p1, g1) IoU 2/3 but wrong label -> 0. pos = 1/2, miss = 0,
    # false alarm = 1/3, compl = 1 - (0 + 1/3)/2 = 5/6; score = 0.7·0.5 + 0.3·5/6 = 0.6
    assert detection_weighted([pred], answer=[gt], **KW) == [pytest.approx(0.6)]
    assert weighted_detection_score([], []) == 1.0
    assert weighted_detection_score([{"box": [0, 0, 1, 1]}], []) == 0.0
    assert weighted_detection_score([], [{"box": [0, 0, 1, 1]}]) == pytest.approx(0.15)  # compl = 1 - 1/2
    with pytest.raises(ValueError, match="positive sum"):
        weighted_detection_score([{"box": [0, 0, 1, 1]}], [{"box": [0, 0, 1, 1]}], weights=(0, 0, 0))


# --- counting ----------------------------------------------------------------------------------------------


def test_count_exact():
    c = [ans("3"), ans("There are 3 cars"), ans("3.5"), ans("-3"), ans(""), "3"]
    assert count_exact(c, answer=[3, "3", 3, 3, 3, 3]) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_count_fuzzy_crowdvlm_worked_by_hand():
    c = [ans("10"), ans("8"), ans("15"), ans("6"), ans("lots"), ans("20000000")]
    # g = |y - ŷ|/y: 0 -> 1.5; 0.2 -> 1.3; 0.5 (not < 0.5) -> 0; 0.4 -> 1.1; unparsable -> 0; > 1e6 -> 0
    assert count_fuzzy(c, answer=[10] * 6) == pytest.approx([1.5, 1.3, 0.0, 1.1, 0.0, 0.0])
    # y = 0: CrowdVLM-R1 divides by zero; here exact 0 -> 1.5, else 0
    assert count_fuzzy([ans("0"), ans("1")], answer=[0, 0]) == [1.5, 0.0]


# --- temporal ----------------------------------------------------------------------------------------------


def test_span_iou_worked_by_hand():
    assert span_iou((12.5, 17.5), (10, 15)) == pytest.approx(2.5 / 7.5)
    assert span_iou((0, 1), (2, 3)) == 0.0
    assert span_iou((5, 3), (3, 5)) == 0.0  # start > end
    assert span_iou((4, 4), (4, 4)) == 1.0  # zero union (VideoChat-R1's rule)
    assert span_iou((4, 4), (5, 5)) == 0.0


def test_temporal_iou_reward_units():
    c = [ans("The event is 12.5 to 17.5"), ans("0.5 to 0.75"), ans("17 to 12"), ans("never"), ans("[10, 15]")]
    assert temporal_iou([c[0], c[2], c[3], c[4]], answer=[[10, 15]] * 4) == pytest.approx([1 / 3, 0.0, 0.0, 1.0])
    r = temporal_iou([c[1]], answer=[(10, 15)], pred_units="normalized", duration=[20.0])
    assert r == [pytest.approx(1.0)]  # 0.5·20 to 0.75·20 = 10 to 15
    r = temporal_iou([c[1]], answer=["10 to 15"], pred_units="normalized", video=[[None] * 40], fps=[2.0])
    assert r == [pytest.approx(1.0)]  # L = 40 frames / 2 fps
    with pytest.raises(ValueError, match="needs the video length"):
        temporal_iou([c[1]], answer=[(10, 15)], pred_units="normalized")
    with pytest.raises(ValueError, match="start > end"):
        temporal_iou([c[0]], answer=[(15, 10)])
    assert temporal_iou([c[0]], answer=[None]) == [None]


def test_multi_span_iou_worked_by_hand():
    assert merge_spans([(1, 3), (0, 2), (5, 6)]) == [(0.0, 3.0), (5.0, 6.0)]
    c = ["<think>t</think><answer>A</answer><glue>[(0, 2), (1, 3), (5, 6)]</glue>"]
    # ∪P = [0,3] ∪ [5,6] (length 4), G = [2,5] (length 3), ∩ = [2,3] (1): 1 / (4 + 3 - 1) = 1/6
    assert multi_span_iou(c, answer=[[(2, 5)]], tag="glue") == [pytest.approx(1 / 6)]
    assert multi_span_iou(["<glue>[(3, 1)]</glue>"], answer=[[(1, 3)]], tag="glue") == [0.0]  # start > end
    assert multi_span_iou(["<answer></answer>"], answer=[[]]) == [1.0]  # both empty
    assert multi_span_iou(["<answer></answer>"], answer=["1 to 2"]) == [0.0]
    assert multi_span_iou(["no tags 1 to 2"], answer=[[(1, 2)]], require_tags=False) == [1.0]


def test_tracking_mean_iou():
    gt = [[0, 0, 0.5, 0.5], [0.5, 0.5, 1, 1]]
    kw = dict(pred_space="normalized_0_1", gt_space="normalized_0_1")
    c = [ans("[[0, 0, 0.5, 0.5], [0.5, 0.5, 1, 0.75]]"), ans("[[0, 0, 0.5, 0.5]]")]
    assert tracking_iou(c, answer=[gt, gt], **kw) == pytest.approx([0.75, 0.0])  # (1 + 0.5)/2; wrong count
    assert tracking_iou(c, answer=[gt, gt], strict_count=False, **kw) == pytest.approx([0.75, 0.5])
    with pytest.raises(ValueError, match="has no boxes"):
        tracking_iou(c[:1], answer=[[]], **kw)


# --- GUI ---------------------------------------------------------------------------------------------------


def test_gui_point_in_box_and_distance():
    cols = {"answer": [[100, 100, 200, 200]] * 4, "image_size": [(1000, 1000)] * 4}
    kw = dict(pred_space="qwen2vl_0_1000", gt_space="original_pixels")
    c = [ans("(150, 150)"), ans("(300, 300)"), ans("click [100, 100, 200, 200]"), ans("nowhere")]
    assert gui_point_in_box(c, **kw, **cols) == [1.0, 0.0, 1.0, 0.0]  # a box counts as its centre
    # target = centre (0.15, 0.15); (250, 150) in 0-1000 -> (0.25, 0.15): d = 0.1/√2
    c2 = [ans("(250, 150)"), ans("(150, 150)"), ans("nowhere")]
    cols2 = {k: v[:3] for k, v in cols.items()}
    assert gui_point_distance(c2, **kw, **cols2) == pytest.approx([math.exp(-1 / math.sqrt(2)), 1.0, 0.0])
    lin = gui_point_distance(c2[:1], kernel="linear", **kw, **{k: v[:1] for k, v in cols.items()})
    assert lin == [pytest.approx(1 - 1 / math.sqrt(2))]
    assert gui_point_distance(
        [ans("(0.5, 0.5)")], answer=[[0.5, 0.5]], pred_space="normalized_0_1", gt_space="normalized_0_1"
    ) == [1.0]  # a point ground truth
    with pytest.raises(ValueError, match="needs a ground-truth box"):
        gui_point_in_box([ans("(1, 1)")], answer=[[1, 1]], pred_space="normalized_0_1", gt_space="normalized_0_1")
    with pytest.raises(ValueError, match="sigma must be > 0"):
        gui_point_distance(c2, sigma=0, **kw, **cols2)
