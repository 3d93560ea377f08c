# strongSwan with the swanctl configuration rendered for this site.

package node['dlinfra_gateway']['strongswan_packages']

# charon's retransmission timing (failover) and route installation, as rendered for the site.
file '/etc/strongswan.d/dlinfra.conf' do
  content lazy { dlinfra_site_file(node['dlinfra_gateway']['charon_source']) }
  mode '0644'
  notifies :restart, 'service[strongswan]', :delayed
end

# Holds the tunnels' pre-shared keys: root-only and kept out of Chef's logs.
file '/etc/swanctl/conf.d/dlinfra.conf' do
  content lazy { dlinfra_site_file(node['dlinfra_gateway']['swanctl_source']) }
  mode '0600'
  sensitive true
  notifies :run, 'execute[swanctl --load-all]', :delayed
end

service 'strongswan' do
  action %i(enable start)
end

# Loads changed connections and secrets into the running daemon without dropping other tunnels.
execute 'swanctl --load-all' do
  command %w(swanctl --load-all)
  action :nothing
end
