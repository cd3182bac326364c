"""Judges: who labels a sample without gold answers (votes, cross-view, self-certainty, the policy as
a judge, the rubric), the validity check that needs no gold, and the oracle `verifier`."""
