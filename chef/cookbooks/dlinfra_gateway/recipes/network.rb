# Forwarding, MSS clamping and, on route-based sites, the tunnels' XFRM interfaces, from `dlinfra site render`:
# the files go in place unmodified, and a boot-time unit re-creates the interfaces and rules before strongSwan.

package 'nftables'

file '/etc/sysctl.d/60-dlinfra-gateway.conf' do
  content lazy { dlinfra_site_file(node['dlinfra_gateway']['sysctl_source']) }
  mode '0644'
  notifies :run, 'execute[load dlinfra sysctl]', :immediately
end

execute 'load dlinfra sysctl' do
  command %w(sysctl --load /etc/sysctl.d/60-dlinfra-gateway.conf)
  action :nothing
end

file DlinfraGateway::Helpers::NFTABLES_FILE do
  content lazy { dlinfra_site_file(node['dlinfra_gateway']['nftables_source']) }
  mode '0644'
  notifies :restart, 'service[dlinfra-gateway-net]', :delayed
end

# Route-based: creates xfrm1/xfrm2 with the inside addresses; charon's updown calls it too (swanctl.conf).
file DlinfraGateway::Helpers::XFRM_SCRIPT do
  content lazy { dlinfra_site_file(node['dlinfra_gateway']['xfrm_source']) }
  mode '0755'
  action dlinfra_route_based? ? :create : :delete
  notifies :restart, 'service[dlinfra-gateway-net]', :delayed
end

template '/etc/systemd/system/dlinfra-gateway-net.service' do
  source 'dlinfra-gateway-net.service.erb'
  mode '0644'
  variables(
    xfrm_script: dlinfra_route_based? ? DlinfraGateway::Helpers::XFRM_SCRIPT : nil,
    nftables_file: DlinfraGateway::Helpers::NFTABLES_FILE
  )
  notifies :run, 'execute[systemctl daemon-reload]', :immediately
  notifies :restart, 'service[dlinfra-gateway-net]', :delayed
end

execute 'systemctl daemon-reload' do
  action :nothing
end

# Started here, before strongSwan's recipe, so the interfaces exist when charon installs its SAs. A oneshot
# without ExecStop: a restart re-runs the idempotent start and reloads the rules, never dropping an interface.
service 'dlinfra-gateway-net' do
  action %i(enable start)
end
