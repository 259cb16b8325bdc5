"""The wire between samplers and the learner: messages (types, limits, errors), the checking
codec, the ZeroMQ transport, CURVE security, and the two-process channel self-test."""
