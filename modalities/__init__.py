"""Modality adapters (one file per model family), tiny model builders and synthetic tasks.

Importing this package registers the built-in adapters and tasks in :mod:`mmgrpo.plugins`.
"""

from . import shapes_task, vlm  # noqa: F401
from . import flow, flow_prompts, flow_task  # noqa: F401  (flow/diffusion adapter, t2i_prompts and flow_shapes tasks)
from . import video, video_task  # noqa: F401  (video adapter, video_motion task)
