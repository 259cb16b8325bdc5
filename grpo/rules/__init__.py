"""The torch-free rules every layer uses: pure functions of the run's settings, no I/O, and no
torch, numpy or zmq (tests/rules/test_torch_free.py), so the launcher can apply them before any
worker starts and each role imports them at the top of its modules.

  backend    which decoder --generation-backend gives a process (auto: the engine on CUDA)
  methods    which weight-sync method each side takes where no method's facts are needed: the
             learner's, auto's order, and the one step down both sides take when a method proves
             impossible (the facts are grpo.weights.registry's; grpo.weights.methods reads them)
  staleness  the one owner of staleness and the generation budget: which groups the learner drops
             as too old, how many groups a sampler may make now, how many prompts its round takes
  layout     how a run's GPUs are split between samplers and learner ranks (--gpus), and what a
             finished run's rates say about its split
  memory     the memory plan: each process's GPU memory from the model's shape and the run's
             flags, and whether it fits (reading the shape and the GPUs is grpo.launch.probe's)
"""
