"""Floor 5, the offline engine: runs the real stack program under Pulumi's mocks against a deterministic fake
cloud, and exports each stack's plan (docs/plan-export.md) with what it was made from (provenance).

May import the floors below (it runs stacks/ by path, as the Pulumi CLI would, rather than importing it).
"""
