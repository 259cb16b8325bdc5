"""The torch-free rules every layer uses: pure functions of the run's settings, no I/O, and no
torch, numpy or zmq (tests/rules/test_torch_free.py), so the launcher can apply them before any
worker starts and each role imports them at the top of its modules.

  backend    which decoder --generation-backend gives a process (auto: the engine on CUDA)
  staleness  the one owner of staleness and the generation budget: which groups the learner drops
             as too old, how many groups a sampler may make now, how many prompts its round takes
  layout     how a run's GPUs are split between samplers and learner ranks (--gpus), and what a
             finished run's rates say about its split
"""
