"""The control channel on the sync port: what an answer carries besides the weights.

  flow     pure rules: the generation budget, the queue view's arithmetic, the per-connection gap floor
  answer   learner side: the run's facts, curriculum levels and budget each answer carries (SyncAnswer)
  client   sampler side: ask, await_answer, request_weights

How the weights themselves are captured and travel is grpo.weights' (its Publisher serves the
sync port and asks a SyncAnswer for every answer's control fields); the exchange is in
docs/weight-sync.md.
"""
