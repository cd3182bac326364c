"""CoMAS (Co-Evolving Multi-Agent Systems via Interaction Rewards, arXiv 2510.08529): agents on one
base model that solve, evaluate and score each other, each trained on the rewards of those
interactions, with no gold answer read.

Per problem and round (`agents.rounds`), every agent writes a solution; from the second round on
the solver sees `agents.references` (kappa) (solution, evaluation) pairs of the round before, drawn
at random. Another agent evaluates each solution ("point out every possible error and defect") and
another scores it on the paper's 1-3 rubric inside `<score>` tags; only the scorer's own output is
read for the tag, so a solution that writes a tag scores nothing. No agent evaluates or scores its
own solution (with 2 agents, the other one does both). Rewards, as the official code allocates
them: solution (s - 1) / 2, evaluation 1 - that (zero-sum), scorer 0 when its score parses and -1
when not (the solution and evaluation then get 0). Each agent trains on its own outputs of every
role with REINFORCE++ advantages, its rewards normalised over its whole buffer, through the GRPO
trainer (clipped ratio against the policy that sampled). The verifier's verdict on each solution is
recorded to measure the agents (`correct`), never used.

Modules: `discussion` (prompts, scores, rewards, the discussion itself, advantages, metrics),
`roster` (each iteration's agents and problems), `report` (the table per agent and iteration).
"""

