"""`dlinfra diff`: what a change does to the infrastructure, from the offline plans of two git revisions.

`plans` and `changes` hold the types; `compare` (with `aliases` and `cascade`) is pure; `render` writes markdown
and JSON; `revisions` runs git and each revision's own preview. May import dlinfra.model, dlinfra.checks,
dlinfra.review.cost and policy.
"""
