# FRR where the gateway speaks BGP: the rendered frr.conf peers with both AWS tunnel endpoints (BGP sites)
# and with the site's hybrid nodes, whose pod blocks it installs (every site with hybrid pods).

package 'frr'

template '/etc/frr/daemons' do
  source 'frr-daemons.erb'
  owner 'frr'
  group 'frr'
  mode '0640'
  variables(
    enabled: dlinfra_frr_daemons,
    known: DlinfraGateway::Helpers::FRR_DAEMONS
  )
  notifies :restart, 'service[frr]', :delayed
end

file '/etc/frr/frr.conf' do
  content lazy { dlinfra_site_file(node['dlinfra_gateway']['frr_source']) }
  owner 'frr'
  group 'frr'
  mode '0640'
  notifies :reload, 'service[frr]', :delayed
end

service 'frr' do
  supports reload: true
  action %i(enable start)
end
