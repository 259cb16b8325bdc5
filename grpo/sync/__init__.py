"""The control channel on the sync port: what an answer carries besides the weights.

  flow       pure rules: the per-connection gap floor (a sampler's groups still on their way)
  answer     learner side: the run's facts, curriculum levels and budget each answer carries (SyncAnswer;
             the budget is grpo.rules.staleness's, the one owner of staleness and the generation budget)
  client     sampler side: ask, await_answer, request_weights

How the weights themselves are captured and travel is grpo.weights' (its Publisher serves the
sync port and asks a SyncAnswer for every answer's control fields); the exchange is in
docs/weight-sync.md.
"""
