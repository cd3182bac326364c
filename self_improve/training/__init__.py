"""Training: the losses (`losses`, pure functions of log-probs) and the trainers that run them (`trainers`)."""
