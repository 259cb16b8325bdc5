"""The wire between samplers and the learner: messages (types, limits, errors), the checking
codec (encode, the shared checks, each kind's decode), the ZeroMQ transport, CURVE security, and
the two-process channel self-test."""
