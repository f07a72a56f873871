"""Hyperparameter sweeps: trials of a job template over a search space, early stopping, and
GPUs that follow results (README "Sweeps").

Pure logic (no I/O, no clock): the search space (:mod:`.space`), the built-in search algorithms
(:mod:`.search`), early stopping (:mod:`.stopping`), the reallocation decision
(:mod:`.realloc`), the sweep spec's checks (:mod:`.spec`) and YAML form (:mod:`.yamlspec`),
and each trial's job (:mod:`.trialjob`). With I/O: Optuna's samplers (:mod:`.optuna_search`),
the controller that runs sweeps on the leader (:mod:`.controller`) with its metrics
(:mod:`.metrics`), and :func:`peloton.report` in the trials' workers (:mod:`.report`).
"""
