"""The runners: the loop's stages without Prefect, and over seeds and variants.

`dag` reads the stages and their order from dvc.yaml, `plain` runs them without DVC, `experiments`
runs variants over seeds as DVC experiments (or plain runs) and keeps their results, `arms` and
`comparison` make the tables of those results, and `console` is the `self-improve` command that
reaches every runner. The Prefect flows (flows/) and the research (research/) use them; the library
(self_improve/) never does.
"""
