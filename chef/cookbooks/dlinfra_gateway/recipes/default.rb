# A site gateway: forwarding, strongSwan tunnels to AWS and, on BGP sites, FRR.

node['dlinfra_gateway']['sysctl'].each do |key, setting|
  sysctl key do
    value setting
  end
end

include_recipe 'dlinfra_gateway::strongswan'
include_recipe 'dlinfra_gateway::frr' if dlinfra_frr?
