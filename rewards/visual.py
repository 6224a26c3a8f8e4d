"""Visual rewards: box IoU/GIoU in explicit coordinate spaces, detection, counting, temporal IoU, tracking, GUI.

**Coordinate spaces** (Qwen2-VL and Qwen2.5-VL technical reports, arXiv 2409.12191 and 2502.13923: the
largest silent failure of IoU rewards in the R1-style repositories). Every box/point reward takes ``pred_space`` (what
the policy writes) and ``gt_space`` (what the
dataset holds) explicitly and converts both to the common space ``normalized_0_1`` (x / W, y / H of the image)
before comparing:

=========================  ==================================================================================
``qwen2vl_0_1000``          Qwen2-VL: relative, scaled to [0, 1000): ``x_n = x / 1000``
``qwen25vl_abs_resized``    Qwen2.5-VL: absolute pixels of the *resized* input (smart_resize); the resized size
                            is ``image_grid_thw · patch_size`` (14): ``x_n = x / (grid_w·14)``, ``y_n = y /
                            (grid_h·14)``
``qwen3vl_0_1000``          Qwen3-VL: relative [0, 1000] again: ``x_n = x / 1000``
``normalized_0_1``          already in [0, 1] (e.g. VideoChat-R1 tracking)
``original_pixels``         pixels of the original image: ``x_n = x / W_orig``, ``y_n = y / H_orig``
=========================  ==================================================================================

The image size comes from the ``image`` column (a PIL image, or a list whose first item is one) or an
``image_size`` column ``(W, H)``; the grid from an ``image_grid_thw`` column (``[t, h, w]`` or ``[[t, h, w]]``),
as VLM-R1 passes it to rewards (qwen_module.py). IoU and GIoU are invariant to per-axis scaling, so comparing
in ``normalized_0_1`` gives the same value as comparing in original pixels.

Boxes are ``[x1, y1, x2, y2]`` with continuous coordinates (area = (x2 − x1)(y2 − y1); no ``+1`` pixel
convention, unlike VLM-R1's intersection). A box with ``x2 < x1`` or ``y2 < y1`` or a non-finite coordinate is
malformed: it scores 0, never an exception. A zero union scores 0 (not a division by zero).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ._common import gt_number, per_answer, whole_completion
from .parsing import (
    Which,
    completion_text,
    extract_tag,
    parse_box,
    parse_boxes,
    parse_json,
    parse_number,
    parse_point,
    parse_time_span,
    parse_time_spans,
)
from .registry import register_reward


class BoxSpace(str, Enum):
    """Coordinate space of boxes and points (see the module docstring)."""

    QWEN2VL_0_1000 = "qwen2vl_0_1000"
    QWEN25VL_ABS_RESIZED = "qwen25vl_abs_resized"
    QWEN3VL_0_1000 = "qwen3vl_0_1000"
    NORMALIZED_0_1 = "normalized_0_1"
    ORIGINAL_PIXELS = "original_pixels"


def box_space(value: Any, arg: str = "space") -> BoxSpace:
    """``value`` as a :class:`BoxSpace`; ``None`` or an unknown name raises a ``ValueError`` listing the spaces."""
    valid = ", ".join(s.value for s in BoxSpace)
    if value is None:
        raise ValueError(f"{arg} is required (boxes are compared only in explicit coordinate spaces); one of: {valid}")
    try:
        return BoxSpace(value.value if isinstance(value, BoxSpace) else value)
    except ValueError:
        raise ValueError(f"unknown {arg} {value!r}; valid: {valid}") from None


@dataclass(frozen=True)
class ImageGeometry:
    """What a space conversion may need: the original ``(W, H)`` and the Qwen2.5-VL ``(t, h, w)`` patch grid."""

    image_size: tuple[float, float] | None = None
    grid_thw: tuple[int, int, int] | None = None
    patch_size: int = 14


def _scale(space: BoxSpace, geo: ImageGeometry) -> tuple[float, float]:
    """``(sx, sy)`` with ``normalized = coords / (sx, sy)`` for ``space``."""
    if space in (BoxSpace.QWEN2VL_0_1000, BoxSpace.QWEN3VL_0_1000):
        return 1000.0, 1000.0
    if space is BoxSpace.NORMALIZED_0_1:
        return 1.0, 1.0
    if space is BoxSpace.ORIGINAL_PIXELS:
        if geo.image_size is None:
            raise ValueError(
                "the 'original_pixels' space needs the image size: give an 'image' column (PIL) or an 'image_size' "
                "column (W, H)"
            )
        return float(geo.image_size[0]), float(geo.image_size[1])
    if geo.grid_thw is None:
        raise ValueError(
            "the 'qwen25vl_abs_resized' space needs the processor's image_grid_thw: give an 'image_grid_thw' column "
            "([t, h, w] per sample)"
        )
    _, gh, gw = geo.grid_thw
    return float(gw * geo.patch_size), float(gh * geo.patch_size)


def to_normalized(coords: Sequence[float], space: BoxSpace | str, geo: ImageGeometry = ImageGeometry()) -> list[float]:
    """Alternating ``x, y`` coordinates (a box ``[x1, y1, x2, y2]`` or a point ``[x, y]``) from ``space`` to
    ``normalized_0_1``."""
    sx, sy = _scale(box_space(space), geo)
    return [v / (sx if i % 2 == 0 else sy) for i, v in enumerate(coords)]


def from_normalized(
    coords: Sequence[float], space: BoxSpace | str, geo: ImageGeometry = ImageGeometry()
) -> list[float]:
    """Inverse of :func:`to_normalized`."""
    sx, sy = _scale(box_space(space), geo)
    return [v * (sx if i % 2 == 0 else sy) for i, v in enumerate(coords)]


def convert_coords(
    coords: Sequence[float], src: BoxSpace | str, dst: BoxSpace | str, geo: ImageGeometry = ImageGeometry()
) -> list[float]:
    """Alternating ``x, y`` coordinates from space ``src`` to space ``dst`` (through ``normalized_0_1``)."""
    return from_normalized(to_normalized(coords, src, geo), dst, geo)


@dataclass(frozen=True)
class Frames:
    """The two coordinate spaces of one sample and its image geometry: ``pred``/``gt`` bring the policy's and the
    dataset's coordinates to ``normalized_0_1``."""

    pred_space: BoxSpace
    gt_space: BoxSpace
    geo: ImageGeometry

    def pred(self, coords: Sequence[float]) -> list[float]:
        return to_normalized(coords, self.pred_space, self.geo)

    def gt(self, coords: Sequence[float]) -> list[float]:
        return to_normalized(coords, self.gt_space, self.geo)


_FRAME_OPTIONS = ("pred_space", "gt_space", "patch_size")


def in_frames(score: Callable[..., float]) -> Callable[..., float]:
    """The options every box/point reward shares, in one place: ``pred_space`` and ``gt_space`` (required; see the
    module docstring) and ``patch_size`` (Qwen2.5-VL's 14). The scoring function names ``frames`` and gets this
    sample's :class:`Frames` instead; put :func:`per_answer` above it."""
    params = inspect.signature(score).parameters

    @functools.wraps(score)
    def scored(
        pred: Any,
        gt: Any,
        *,
        columns: dict[str, Any],
        i: int,
        pred_space: str | None = None,
        gt_space: str | None = None,
        patch_size: int = 14,
        **opts: Any,
    ) -> float:
        spaces = box_space(pred_space, "pred_space"), box_space(gt_space, "gt_space")
        context = {k: v for k, v in (("columns", columns), ("i", i)) if k in params}
        return score(pred, gt, frames=Frames(*spaces, geometry(columns, i, patch_size)), **context, **opts)

    P = inspect.Parameter
    own = [p for name, p in params.items() if name not in ("frames", "columns", "i")]
    shared = [
        P("columns", P.KEYWORD_ONLY, annotation="dict[str, Any]"),
        P("i", P.KEYWORD_ONLY, annotation="int"),
        P("pred_space", P.KEYWORD_ONLY, default=None, annotation="str | None"),
        P("gt_space", P.KEYWORD_ONLY, default=None, annotation="str | None"),
        P("patch_size", P.KEYWORD_ONLY, default=14, annotation="int"),
    ]
    positional = [p for p in own if p.kind is not P.KEYWORD_ONLY]
    scored.__signature__ = inspect.Signature(positional + shared + [p for p in own if p.kind is P.KEYWORD_ONLY])
    return scored


def _valid_box(b: Sequence[float] | None) -> bool:
    return b is not None and len(b) == 4 and all(math.isfinite(v) for v in b) and b[2] >= b[0] and b[3] >= b[1]


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of two ``[x1, y1, x2, y2]`` boxes: ``|a ∩ b| / |a ∪ b|``; 0 for a malformed box or a zero union."""
    if not (_valid_box(a) and _valid_box(b)):
        return 0.0
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def box_giou(a: Sequence[float], b: Sequence[float]) -> float:
    """Generalised IoU (Rezatofighi et al. 2019): ``IoU − |C \\ (a ∪ b)| / |C|`` with C the smallest enclosing
    box; in [−1, 1]. −1 for a malformed box; a zero-area enclosing box (identical points) gives 0."""
    if not (_valid_box(a) and _valid_box(b)):
        return -1.0
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    hull = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
    if hull <= 0:
        return 0.0
    iou = inter / union if union > 0 else 0.0
    return iou - (hull - union) / hull


# --- per-sample geometry and ground truth -----------------------------------------------------------------


def _size_of(image: Any) -> tuple[float, float] | None:
    if isinstance(image, (list, tuple)) and image:
        image = image[0]
    size = getattr(image, "size", None)  # PIL: (W, H); arrays/tensors are not guessed (HWC vs CHW)
    if isinstance(size, tuple) and len(size) == 2:
        return float(size[0]), float(size[1])
    return None


def _grid(value: Any) -> tuple[int, int, int] | None:
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    while isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], (list, tuple)):
        value = value[0]
    if isinstance(value, (list, tuple)) and len(value) and isinstance(value[0], (list, tuple)):
        raise ValueError(f"image_grid_thw holds {len(value)} images for one sample; box rewards need exactly one")
    if not (isinstance(value, (list, tuple)) and len(value) == 3):
        raise ValueError(f"image_grid_thw must be [t, h, w], got {value!r}")
    t, h, w = (int(v) for v in value)
    return t, h, w


def geometry(columns: dict[str, Any], i: int, patch_size: int = 14) -> ImageGeometry:
    """The :class:`ImageGeometry` of sample ``i`` from the ``image_size``/``image`` and ``image_grid_thw`` columns."""
    size = None
    if "image_size" in columns and columns["image_size"][i] is not None:
        w, h = columns["image_size"][i]
        size = (float(w), float(h))
    elif "image" in columns:
        size = _size_of(columns["image"][i])
    grid = _grid(columns["image_grid_thw"][i]) if "image_grid_thw" in columns else None
    return ImageGeometry(size, grid, patch_size)


def _gt_boxes(gt: Any) -> list[list[float]]:
    """Ground-truth boxes from a box, a list of boxes, dicts with a box field, or text."""
    if isinstance(gt, str):
        parsed = parse_json(gt)
        return _gt_boxes(parsed) if parsed is not None and not isinstance(parsed, (int, float)) else parse_boxes(gt)
    if hasattr(gt, "tolist"):
        gt = gt.tolist()
    if isinstance(gt, dict):
        box = _box_field(gt)
        return [] if box is None else [box]
    if isinstance(gt, (list, tuple)):
        if len(gt) == 4 and all(isinstance(v, (int, float)) for v in gt):
            return [[float(v) for v in gt]]
        out = []
        for item in gt:
            out.extend(_gt_boxes(item))
        return out
    raise ValueError(f"cannot read ground-truth boxes from {gt!r}")


def _box_field(d: dict) -> list[float] | None:
    for key, value in d.items():
        is_box_key = str(key).lower() in ("bbox_2d", "bbox", "box", "position", "bbox_xyxy")
        if is_box_key and isinstance(value, (list, tuple)) and len(value) == 4:
            try:
                return [float(v) for v in value]
            except (TypeError, ValueError):
                return None
    return None


def _field(d: dict, names: tuple[str, ...]) -> Any:
    for key, value in d.items():
        if str(key).lower() in names:
            return value
    return None


def _one_gt_box(gt: Any, reward: str) -> list[float]:
    boxes = _gt_boxes(gt)
    if len(boxes) != 1 or not _valid_box(boxes[0]):
        raise ValueError(f"reward {reward!r}: the ground truth must hold exactly one valid box, got {gt!r}")
    return boxes[0]


def _box_score(name: str, metric: Callable, text: str | None, gt: Any, frames: Frames, box_which: Which) -> float:
    """``metric`` of the ``box_which`` box of ``text`` against the ground-truth box, both in ``normalized_0_1``."""
    g = frames.gt(_one_gt_box(gt, name))
    p = parse_box(text, box_which) if text is not None else None
    return metric(frames.pred(p), g) if p is not None else metric([math.nan] * 4, g)


@register_reward(
    "iou", "IoU of the predicted box with the ground-truth box, both converted from explicit coordinate spaces"
)
@per_answer("iou")
@in_frames
def iou(pred: Any, gt: Any, *, frames: Frames, threshold: float | None = None, box_which: Which = "first") -> float:
    """Box IoU reward (referring-expression grounding).

    The predicted box is the ``box_which`` (first) box in the ``which`` (last) ``<answer>``; the ground truth is
    one box (``[x1, y1, x2, y2]``, a ``{"bbox_2d": …}`` dict or text). Both are converted to ``normalized_0_1``
    from ``pred_space`` / ``gt_space`` (required; see the module docstring), then
    ``r = |P ∩ G| / |P ∪ G|``, or ``1[IoU > threshold]`` when ``threshold`` is set. No or malformed box → 0.

    Source: VLM-R1's soft IoU reward (om-ai-lab/VLM-R1 ``iou_reward``; om-ai-lab/VLM-R1
    ``src/open-r1-multimodal/src/open_r1/vlm_modules/qwen_module.py``), with float boxes, a
    guarded zero union and explicit spaces; ``threshold=0.5`` is its commented-out hard variant.
    """
    score = _box_score("iou", box_iou, pred, gt, frames, box_which)
    return score if threshold is None else float(score > threshold)


@register_reward(
    "giou", "generalised IoU (in [-1, 1]) of the predicted and ground-truth boxes in explicit coordinate spaces"
)
@per_answer("giou")
@in_frames
def giou(pred: Any, gt: Any, *, frames: Frames, box_which: Which = "first") -> float:
    """Generalised-IoU box reward.

    ``r = IoU − |C \\ (P ∪ G)| / |C|`` (Rezatofighi et al. 2019, CVPR), C the smallest box enclosing P and G;
    ``r ∈ [−1, 1]`` and, unlike IoU, still informative when the boxes do not overlap. No or malformed box → −1.
    Parsing and spaces as in :func:`iou`.

    Source: Rezatofighi et al. 2019, "Generalized Intersection over Union" (CVPR); a dense alternative to
    VLM-R1's IoU reward (om-ai-lab/VLM-R1 ``src/open-r1-multimodal/src/open_r1/vlm_modules/qwen_module.py``).
    """
    return _box_score("giou", box_giou, pred, gt, frames, box_which)


# --- detection ----------------------------------------------------------------------------------------------


def parse_detections(text: str) -> list[dict]:
    """Predicted objects as ``{"box": [x1, y1, x2, y2], "confidence": float | None, "label": str | None}``.

    Reads a JSON list (or a ```json fence) of dicts with a box field (``Position``, ``bbox_2d``, ``bbox``,
    ``box``) and optional ``Confidence``/``score`` and ``label`` fields, repairing single quotes, a trailing
    comma and a list truncated mid-object (cut at the last ``},`` and closed, as Visual-RFT does); else every
    bare box in the text (no confidence, no label). Exact duplicate boxes are kept once.
    """
    if text is None:
        return []
    parsed = parse_json(text)
    if not isinstance(parsed, list) and "}," in text:
        start = text.find("[")
        if start >= 0:
            parsed = parse_json(text[start : text.rfind("},") + 1] + "]")
    items: list[dict] = []
    if isinstance(parsed, list) and parsed and all(isinstance(x, dict) for x in parsed):
        for d in parsed:
            box = _box_field(d)
            if box is None:
                continue
            conf = _field(d, ("confidence", "score", "conf"))
            label = _field(d, ("label", "category", "class"))
            try:
                conf = None if conf is None else float(conf)
            except (TypeError, ValueError):
                conf = None
            items.append({"box": box, "confidence": conf, "label": None if label is None else str(label)})
    elif isinstance(parsed, list) and parsed and all(isinstance(x, (list, tuple)) for x in parsed):
        items = [{"box": [float(v) for v in b], "confidence": None, "label": None} for b in parsed if len(b) == 4]
    else:
        items = [{"box": b, "confidence": None, "label": None} for b in parse_boxes(text)]
    seen, unique = set(), []
    for it in items:
        key = tuple(it["box"])
        if key not in seen:
            seen.add(key)
            unique.append(it)
    return unique


def _gt_objects(gt: Any) -> list[dict]:
    """Ground-truth objects ``{"box", "label"}`` from boxes, dicts or text."""
    if isinstance(gt, str):
        parsed = parse_json(gt)
        gt = parsed if parsed is not None else parse_boxes(gt)
    if hasattr(gt, "tolist"):
        gt = gt.tolist()
    if isinstance(gt, dict):
        gt = [gt]
    if isinstance(gt, (list, tuple)) and len(gt) == 4 and all(isinstance(v, (int, float)) for v in gt):
        gt = [gt]
    out = []
    for item in gt or []:
        if isinstance(item, dict):
            box = _box_field(item)
            label = _field(item, ("label", "category", "class"))
            if box is None:
                raise ValueError(f"ground-truth object {item!r} has no box field (bbox_2d, bbox, box, position)")
            out.append({"box": box, "label": None if label is None else str(label)})
        else:
            out.append({"box": [float(v) for v in item], "label": None})
    return out


def _normalize_objects(objs: list[dict], to_normal: Callable[[Sequence[float]], list[float]]) -> list[dict]:
    return [{**o, "box": to_normal(o["box"])} for o in objs]


def visual_rft_score(preds: list[dict], gts: list[dict], iou_threshold: float = 0.5) -> tuple[float, float]:
    """``(R_IoU, R_conf)`` of Visual-RFT for boxes in one space.

    Predictions in descending confidence each take the best-IoU unmatched ground truth; a match needs
    ``IoU > iou_threshold``, otherwise that prediction's IoU counts 0. ``R_IoU = Σ_k IoU_k / max(|G|, |P|)``;
    ``R_conf = (1/|P|) Σ_k (c_k if matched else 1 − c_k)`` with c clipped to [0, 1]. Both empty → ``(1, 1)``;
    no predictions → ``(0, 0)``.
    """
    if not preds and not gts:
        return 1.0, 1.0
    if not preds:
        return 0.0, 0.0
    order = sorted(preds, key=lambda p: -p["confidence"])
    used: set[int] = set()
    ious, conf = [], []
    for p in order:
        best, best_j = 0.0, -1
        for j, g in enumerate(gts):
            if j not in used:
                v = box_iou(p["box"], g["box"])
                if v > best:
                    best, best_j = v, j
        c = min(1.0, max(0.0, p["confidence"]))
        if best > iou_threshold:
            used.add(best_j)
            ious.append(best)
            conf.append(c)
        else:
            ious.append(0.0)
            conf.append(1.0 - c)
    return sum(ious) / max(len(gts), len(preds)), sum(conf) / len(preds)


@register_reward(
    "detection_visual_rft",
    "Visual-RFT detection reward: R_IoU + R_conf with confidence-ordered IoU>0.5 matching, in [0, 2]",
)
@per_answer("detection_visual_rft")
@in_frames
def detection_visual_rft(pred: Any, gt: Any, *, frames: Frames, iou_threshold: float = 0.5) -> float:
    """Visual-RFT IoU + confidence detection reward.

    The answer is a list of ``{"Position": [x1, y1, x2, y2], "Confidence": c}`` (:func:`parse_detections`;
    predictions without a confidence are dropped, as the prompt asks for one). With the matching of
    :func:`visual_rft_score`: ``r = R_IoU + R_conf ∈ [0, 2]``; add ``format`` separately as Visual-RFT does.
    Ground truth: a list of boxes or ``{"bbox": …}`` dicts; an empty list is allowed (then only an empty
    prediction scores 2).

    Source: Liu et al. 2025, "Visual-RFT" (arXiv 2503.01785), ``grpo.py`` v2 IoU and confidence rewards
    (Liuziyu77/Visual-RFT ``src/virft/src/open_r1/grpo.py``).
    """
    gts = _normalize_objects(_gt_objects(gt), frames.gt)
    preds = [p for p in parse_detections(pred) if p["confidence"] is not None and math.isfinite(p["confidence"])]
    r_iou, r_conf = visual_rft_score(_normalize_objects(preds, frames.pred), gts, iou_threshold)
    return r_iou + r_conf


def weighted_detection_score(
    preds: list[dict],
    gts: list[dict],
    iou_threshold: float = 0.5,
    weights: tuple[float, float, float] = (0.7, 0.0, 0.3),
) -> float:
    """VLM-R1's ``weighted_sum`` detection score for boxes in one space.

    Greedy matching in descending IoU over all pairs with ``IoU ≥ iou_threshold``; a matched pair whose labels
    are both given and differ counts IoU 0 (it stays matched). ``pos = Σ IoU / |G|``, ``label = #same label / |G|``,
    ``miss = unmatched G / |G|``, ``false_alarm = unmatched P / |P|`` (0 when |P| = 0),
    ``compl = 1 − (miss + false_alarm)/2``, ``score = (w_pos·pos + w_label·label + w_compl·compl) / Σw``.
    No ground truth: 1 if no predictions, else 0.
    """
    if not gts:
        return 1.0 if not preds else 0.0
    pairs = sorted(
        ((box_iou(p["box"], g["box"]), i, j) for i, p in enumerate(preds) for j, g in enumerate(gts)), reverse=True
    )
    used_p, used_g, pos, label_ok = set(), set(), 0.0, 0
    for v, i, j in pairs:
        if v < iou_threshold:
            break
        if i in used_p or j in used_g:
            continue
        used_p.add(i)
        used_g.add(j)
        lp, lg = preds[i].get("label"), gts[j].get("label")
        same = lp is None or lg is None or lp.strip().lower() == lg.strip().lower()
        pos += v if same else 0.0
        label_ok += same
    miss = (len(gts) - len(used_g)) / len(gts)
    false_alarm = (len(preds) - len(used_p)) / len(preds) if preds else 0.0
    compl = 1.0 - (miss + false_alarm) / 2.0
    w_pos, w_label, w_compl = weights
    total = w_pos + w_label + w_compl
    if total <= 0:
        raise ValueError(f"detection weights must have a positive sum, got {weights}")
    return (w_pos * pos / len(gts) + w_label * label_ok / len(gts) + w_compl * compl) / total


@register_reward(
    "detection_weighted",
    "VLM-R1 weighted_sum detection score: 0.7*mean matched IoU + 0.3*completeness (greedy IoU>=0.5 matching)",
)
@per_answer("detection_weighted", require_tags=False)
@in_frames
def detection_weighted(
    pred: Any,
    gt: Any,
    *,
    frames: Frames,
    iou_threshold: float = 0.5,
    weights: tuple[float, float, float] = (0.7, 0.0, 0.3),
) -> float:
    """Matched, weighted detection score (:func:`weighted_detection_score`) in [0, 1].

    The answer is a JSON list of ``{"bbox_2d": […], "label": …}`` (a ```json fence is fine) or bare boxes;
    VLM-R1's OVD answers sit in a fence, not necessarily in ``<answer>`` tags, so ``require_tags=False`` here.

    Source: VLM-R1 ``detection_score`` / ``weighted_sum`` (om-ai-lab/VLM-R1
    ``src/open-r1-multimodal/src/open_r1/vlm_modules/qwen_module.py``): weights ``(pos, label, compl) =
    (0.7, 0.0, 0.3)``.
    """
    gts = _normalize_objects(_gt_objects(gt), frames.gt)
    preds = _normalize_objects(parse_detections(pred), frames.pred)
    return weighted_detection_score(preds, gts, iou_threshold, tuple(weights))


# --- counting -----------------------------------------------------------------------------------------------


def _count(text: str | None, max_count: float) -> float | None:
    """A non-negative integer count ≤ ``max_count`` from the answer's last number; else ``None``."""
    if text is None:
        return None
    v = parse_number(text, which="last", fractions=False)
    if v is None or not math.isfinite(v) or v < 0 or v > max_count or v != int(v):
        return None
    return v


@register_reward("count_exact", "1 if the answered count equals the ground-truth count, else 0")
@per_answer("count_exact")
def count_exact(pred: Any, gt: Any) -> float:
    """Exact counting reward: ``r = 1[ŷ = y]`` with ŷ the last number in the answer, required to be a
    non-negative integer (``"3.5"`` or ``"-2"`` score 0).

    Source: R1-V's CLEVR counting reward (Deep-Agent/R1-V ``src/r1-v/src/open_r1/grpo.py``).
    """
    y = gt_number(gt, "count_exact")
    p = _count(pred, math.inf)
    return float(p is not None and p == y)


@register_reward("count_fuzzy", "CrowdVLM-R1 fuzzy count reward: 1.5 - |y-ŷ|/y if that relative error < 0.5, else 0")
@per_answer("count_fuzzy")
def count_fuzzy(
    pred: Any,
    gt: Any,
    *,
    max_error: float = 0.5,
    exact_bonus: float = 1.5,
    max_count: float = 1e6,
) -> float:
    """Fuzzy counting reward (FGRPR).

    ``g = |y − ŷ| / y``; ``r = exact_bonus − g`` if ``g < max_error`` else 0 (an exact count gives 1.5; 49 % off
    gives 1.01). ŷ must be a non-negative integer ≤ ``max_count``, else 0. ``y = 0`` (where CrowdVLM-R1 divides
    by zero, an unguarded division in the original) gives ``exact_bonus`` for ``ŷ = 0`` and 0 otherwise.

    Source: CrowdVLM-R1's fuzzy group relative policy reward (yeyimilk/CrowdVLM-R1 ``count_reward``;
    yeyimilk/CrowdVLM-R1 ``VLM-R1/src/open-r1-multimodal/src/open_r1/grpo_rec.py``).
    """
    y = gt_number(gt, "count_fuzzy")
    p = _count(pred, max_count)
    if p is None:
        return 0.0
    if y == 0:
        return float(exact_bonus) if p == 0 else 0.0
    g = abs(y - p) / abs(y)
    return exact_bonus - g if g < max_error else 0.0


# --- temporal -----------------------------------------------------------------------------------------------


def span_iou(pred: Sequence[float], gt: Sequence[float]) -> float:
    """IoU of two time spans ``(start, end)``: ``max(0, min(e, ê) − max(s, ŝ)) / (max(e, ê) − min(s, ŝ))``.

    0 when the prediction has ``start > end`` or a non-finite value. The denominator is the hull, which equals
    the union whenever the spans overlap (and the IoU is 0 otherwise). A zero hull (both spans the same
    instant) gives 1, as in VideoChat-R1.
    """
    s, e = pred
    gs, ge = gt
    if not all(math.isfinite(v) for v in (s, e, gs, ge)) or s > e:
        return 0.0
    hull = max(e, ge) - min(s, gs)
    if hull <= 0:
        return 1.0
    return max(0.0, min(e, ge) - max(s, gs)) / hull


def _duration(columns: dict[str, Any], i: int) -> float:
    if "duration" in columns and columns["duration"][i] is not None:
        return float(columns["duration"][i])
    if "video" in columns and "fps" in columns and columns["fps"][i]:
        return len(columns["video"][i]) / float(columns["fps"][i])
    raise ValueError(
        "converting between 'seconds' and 'normalized' needs the video length: give a 'duration' column (seconds) "
        "or 'video' (frames) and 'fps' columns (L = frames / fps, as Temporal-R1)"
    )


def _span_units(span: Sequence[float], units: str, to_seconds: float | None) -> tuple[float, float]:
    if units not in ("seconds", "normalized"):
        raise ValueError(f"time units must be 'seconds' or 'normalized', got {units!r}")
    s, e = float(span[0]), float(span[1])
    if units == "normalized" and to_seconds is not None:
        return s * to_seconds, e * to_seconds
    return s, e


def _gt_span(gt: Any, reward: str) -> tuple[float, float]:
    if isinstance(gt, str):
        span = parse_time_span(gt, "last")
        if span is None:
            raise ValueError(f"reward {reward!r}: cannot read a (start, end) span from the ground truth {gt!r}")
        return span
    if hasattr(gt, "tolist"):
        gt = gt.tolist()
    if isinstance(gt, dict):
        gt = (gt.get("start_time", gt.get("start")), gt.get("end_time", gt.get("end")))
    if not (isinstance(gt, (list, tuple)) and len(gt) == 2):
        raise ValueError(f"reward {reward!r}: the ground truth must be a (start, end) span, got {gt!r}")
    s, e = float(gt[0]), float(gt[1])
    if s > e:
        raise ValueError(f"reward {reward!r}: ground-truth span {gt!r} has start > end")
    return s, e


@register_reward(
    "temporal_iou", "temporal IoU of the predicted (start, end) span with the ground truth, seconds or normalised"
)
@per_answer("temporal_iou")
def temporal_iou(
    pred: Any,
    gt: Any,
    *,
    columns: dict[str, Any],
    i: int,
    pred_units: str = "seconds",
    gt_units: str = "seconds",
    span_which: Which = "last",
) -> float:
    """Temporal-grounding IoU.

    The span is the ``span_which`` (last) ``"s to e"`` / ``"s - e"`` / ``[s, e]`` / ``{"start_time": …}`` in the
    ``which`` (last) ``<answer>`` (:func:`~mmgrpo.rewards.parsing.parse_time_spans`); ``r`` =
    :func:`span_iou`. ``pred_units``/``gt_units`` are ``"seconds"`` or ``"normalized"`` (fractions of the
    video length); when they differ, the length comes from a ``duration`` column, or ``len(video) / fps``.
    IoU is scale-invariant, so equal units need no length. No span → 0.

    Source: VideoChat-R1 ``iou_timestamp_reward`` (seconds; OpenGVLab/VideoChat-R1 ``src/open_r1/grpo_tasks.py``) and
    Temporal-R1 (normalised by
    L = frames / fps; appletea233/Temporal-R1, arXiv 2506.01908), with the zero-union guard Temporal-R1 lacks.
    """
    to_s = _duration(columns, i) if pred_units != gt_units else None
    g = _span_units(_gt_span(gt, "temporal_iou"), gt_units, to_s)
    p = parse_time_span(pred, span_which) if pred is not None else None
    return 0.0 if p is None else span_iou(_span_units(p, pred_units, to_s), g)


def merge_spans(spans: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    """Union of spans as sorted, disjoint ``(start, end)`` intervals (touching spans merge)."""
    out: list[list[float]] = []
    for s, e in sorted((float(s), float(e)) for s, e in spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def multi_span_iou_value(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]]) -> float:
    """``|∪P ∩ ∪G| / (|∪P| + |∪G| − |∪P ∩ ∪G|)`` after merging overlaps on each side. Zero union: 1 if both
    sides are empty (or all instants), else 0. A predicted span with start > end makes the prediction invalid (0)."""
    if any(s > e or not (math.isfinite(s) and math.isfinite(e)) for s, e in pred):
        return 0.0
    P, G = merge_spans(pred), merge_spans(gt)
    inter = 0.0
    for s, e in P:
        for gs, ge in G:
            inter += max(0.0, min(e, ge) - max(s, gs))
    union = sum(e - s for s, e in P) + sum(e - s for s, e in G) - inter
    if union <= 0:  # both sides empty, or the same instants
        return float(P == G)
    return inter / union


@register_reward("multi_span_iou", "IoU of the unions of predicted and ground-truth time spans (overlaps merged)")
@per_answer("multi_span_iou", extract=whole_completion)
def multi_span_iou(pred: Any, gt: Any, *, which: Which, require_tags: bool, tag: str = "answer") -> float:
    """Multi-interval temporal IoU (:func:`multi_span_iou_value`), in seconds.

    Spans are every ``(s, e)`` / ``"s to e"`` in the ``which`` (last) ``<tag>`` (VideoChat-R1's grounded QA
    uses ``tag="glue"``). Ground truth: a list of ``(s, e)`` pairs or text. No span → 0 (unless the ground
    truth is empty too).

    Source: VideoChat-R1 ``iou_glue_reward`` (OpenGVLab/VideoChat-R1 ``src/open_r1/grpo_tasks.py``).
    """
    g = parse_time_spans(gt) if isinstance(gt, str) else [tuple(map(float, s)) for s in gt]
    text = completion_text(pred)
    content = extract_tag(text, tag, which)
    if content is None and not require_tags:
        content = text
    return multi_span_iou_value(parse_time_spans(content) if content is not None else [], g)


@register_reward(
    "tracking_iou", "mean IoU over frames of the predicted track (one box per frame) with the ground-truth track"
)
@per_answer("tracking_iou")
@in_frames
def tracking_iou(pred: Any, gt: Any, *, frames: Frames, strict_count: bool = True) -> float:
    """Tracking mean IoU.

    The prediction is the list of boxes in the answer, one per frame; the ground truth a list of K boxes.
    ``r = (1/K) Σ_k IoU(b̂_k, b_k)``. With ``strict_count`` (VideoChat-R1 requires exactly 8 boxes) a
    prediction with ≠ K boxes scores 0; otherwise missing frames count 0 and extra boxes are ignored.
    Spaces as in :func:`iou` (VideoChat-R1 uses ``normalized_0_1`` for both).

    Source: VideoChat-R1 ``tracking_iou_reward`` (arXiv 2504.06958; OpenGVLab/VideoChat-R1
    ``src/open_r1/grpo_tasks.py``).
    """
    g = [frames.gt(b) for b in _gt_boxes(gt)]
    if not g:
        raise ValueError(f"reward 'tracking_iou': the ground-truth track {gt!r} has no boxes")
    p = [frames.pred(b) for b in (parse_boxes(pred) if pred is not None else [])]
    if strict_count and len(p) != len(g):
        return 0.0
    return sum(box_iou(a, b) for a, b in zip(p, g)) / len(g)


# --- GUI ----------------------------------------------------------------------------------------------------


def _pred_point(text: str | None, which: Which) -> list[float] | None:
    """The answer's point; a box stands for its centre (click models sometimes answer with a box)."""
    if text is None:
        return None
    pt = parse_point(text, which)
    if pt is None:
        box = parse_box(text, which)
        if box is not None and _valid_box(box):
            pt = [(box[0] + box[2]) / 2, (box[1] + box[3]) / 2]
    return pt if pt is not None and all(math.isfinite(v) for v in pt) else None


def _gt_target(gt: Any, reward: str) -> tuple[list[float] | None, list[float] | None]:
    """``(box, point)`` of a GUI ground truth: a box ``[x1, y1, x2, y2]`` or a point ``[x, y]``."""
    if isinstance(gt, str):
        box = parse_box(gt)
        if box is not None:
            return box, None
        pt = parse_point(gt)
        if pt is None:
            raise ValueError(f"reward {reward!r}: cannot read a box or point from the ground truth {gt!r}")
        return None, pt
    if hasattr(gt, "tolist"):
        gt = gt.tolist()
    if isinstance(gt, dict):
        box = _box_field(gt)
        if box is not None:
            return box, None
        gt = _field(gt, ("point", "point_2d", "click"))
    if isinstance(gt, (list, tuple)) and len(gt) in (2, 4):
        vals = [float(v) for v in gt]
        return (vals, None) if len(vals) == 4 else (None, vals)
    raise ValueError(f"reward {reward!r}: the ground truth must be a box or a point, got {gt!r}")


@register_reward("gui_point_in_box", "1 if the predicted click point lies inside the ground-truth element box")
@per_answer("gui_point_in_box")
@in_frames
def gui_point_in_box(pred: Any, gt: Any, *, which: Which, frames: Frames) -> float:
    """GUI grounding click accuracy: ``r = 1[x1 ≤ x̂ ≤ x2 and y1 ≤ ŷ ≤ y2]`` for the predicted point (a
    predicted box counts as its centre) and the ground-truth box, after space conversion. No point → 0.

    Source: the "inside-box" click reward of GUI grounding RL (e.g. UI-R1, GUI-R1), the baseline LPO improves on
    (arXiv 2506.09373; arXiv 2506.09373).
    """
    box, _ = _gt_target(gt, "gui_point_in_box")
    if box is None:
        raise ValueError(f"reward 'gui_point_in_box' needs a ground-truth box, got the point {gt!r}")
    b = frames.gt(box)
    pt = _pred_point(pred, which)
    if pt is None:
        return 0.0
    x, y = frames.pred(pt)
    return float(b[0] <= x <= b[2] and b[1] <= y <= b[3])


@register_reward(
    "gui_point_distance",
    "distance reward exp(-d/sigma) (or linear) between the predicted point and the target, d in normalised units",
)
@per_answer("gui_point_distance")
@in_frames
def gui_point_distance(
    pred: Any, gt: Any, *, which: Which, frames: Frames, kernel: str = "exp", sigma: float = 0.1
) -> float:
    """Distance-based click reward that still credits near misses.

    ``d = ‖p̂ − p‖₂ / √2`` in ``normalized_0_1`` coordinates (0 at the target, 1 across the whole diagonal),
    where ``p`` is the ground-truth point or the centre of the ground-truth box. ``kernel="exp"``:
    ``r = exp(−d / sigma)``; ``kernel="linear"``: ``r = max(0, 1 − d / sigma)``. No point → 0.

    Source: LPO's dynamic location reward (arXiv 2506.09373; arXiv 2506.09373). The paper's exact
    form was not available; this is our reading of its description.
    """
    if kernel not in ("exp", "linear"):
        raise ValueError(f"gui_point_distance: kernel must be 'exp' or 'linear', got {kernel!r}")
    if not sigma > 0:
        raise ValueError(f"gui_point_distance: sigma must be > 0, got {sigma!r}")
    box, pt_gt = _gt_target(gt, "gui_point_distance")
    target = frames.gt(pt_gt if box is None else [(box[0] + box[2]) / 2, (box[1] + box[3]) / 2])
    pt = _pred_point(pred, which)
    if pt is None:
        return 0.0
    x, y = frames.pred(pt)
    d = math.hypot(x - target[0], y - target[1]) / math.sqrt(2.0)
    return math.exp(-d / sigma) if kernel == "exp" else max(0.0, 1.0 - d / sigma)
