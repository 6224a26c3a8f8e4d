"""Where a model-based reward's weights come from, found before any model loads (the load-time check).

``pickscore`` and ``clip_score`` load their weights when the reward is built, which the trainer does after the
policy model has loaded; a hub that cannot be reached would then cost minutes of retries and end in a traceback.
:func:`hub_weights_problem` answers, in well under a second and without downloading anything, whether a hub id
can be loaded: a local directory or file, a snapshot in the Hugging Face cache, or (not offline) a hub that
answers one ``HEAD`` request. :func:`mmgrpo.preflight.preflight` runs each registered reward's ``load_check``
(:func:`mmgrpo.rewards.register_reward`) and turns a problem into one line naming the reward and how to provide
the weights.
"""

from __future__ import annotations

from mmgrpo.hub import PROBE_TIMEOUT_S, hf_cache_dir, hf_endpoint, hf_offline, hub_weights_problem

__all__ = ["PROBE_TIMEOUT_S", "hf_cache_dir", "hf_endpoint", "hf_offline", "hub_weights_problem"]
