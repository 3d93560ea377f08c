"""Reachability over the plans: the network model (topology) read from plan exports (from_plans), the flows the fleet
implies (intents) and the user's own (flows) between ends (endpoints), and the hop-by-hop engine that proves each open
or closed (engine, evaluation); `check` runs them. Part of the checks floor."""
