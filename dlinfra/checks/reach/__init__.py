"""Reachability over the plans: the topology read from plan exports, the flows the fleet implies (intents), and the
hop-by-hop engine that proves each open or closed. Part of the checks floor."""
