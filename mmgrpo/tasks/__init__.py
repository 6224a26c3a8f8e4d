"""Prompt sources: synthetic tasks with a held-out split (and user datasets).

Importing this package registers the built-in tasks in :mod:`mmgrpo.plugins`. Dependency rule: tasks import
rewards and the core, never :mod:`mmgrpo.modalities`.
"""

from . import (  # noqa: F401
    arithmetic,
    dataset,
    flow_shapes,
    gridworld,
    gui,
    shapes,
    sokoban,
    spoken_digits,
    t2i_prompts,
    video_find,
    video_motion,
    zoom,
)
