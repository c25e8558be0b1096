"""Queue and exchange arguments, policies, runtime parameters, name limits."""
