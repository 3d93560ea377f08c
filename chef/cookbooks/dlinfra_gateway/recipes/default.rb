# A site gateway: forwarding, tunnel interfaces and MSS clamping, strongSwan tunnels to AWS and FRR routing.

include_recipe 'dlinfra_gateway::network'
include_recipe 'dlinfra_gateway::strongswan'
include_recipe 'dlinfra_gateway::frr' if dlinfra_frr?
