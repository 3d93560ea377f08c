# nodeadm install (kubelet, credential helper) and nodeadm init with the site's rendered NodeConfig.

hybrid = node['dlinfra_hybrid']

remote_file '/usr/local/bin/nodeadm' do
  source dlinfra_nodeadm_url
  checksum hybrid['nodeadm']['checksum'] if hybrid['nodeadm']['checksum']
  mode '0755'
end

# containerd comes from dlinfra_base (distro package), so nodeadm must not install a second one.
execute 'nodeadm install' do
  command ['/usr/local/bin/nodeadm', 'install', hybrid['kubernetes_version'],
           '--credential-provider', dlinfra_credential_provider, '--containerd-source', 'none']
  not_if { dlinfra_kubelet_installed?(hybrid['kubernetes_version']) }
end

directory ::File.dirname(hybrid['node_config_path']) do
  mode '0700'
  recursive true
end

# A changed NodeConfig (new activation, new cluster endpoint) re-runs init; an unchanged one does not.
file hybrid['node_config_path'] do
  content lazy { dlinfra_site_file(hybrid['node_config_source']) }
  mode '0600'
  sensitive true
  notifies :run, 'execute[nodeadm init]', :immediately
end

execute 'nodeadm init' do
  command ['/usr/local/bin/nodeadm', 'init', '--config-source', "file://#{hybrid['node_config_path']}"]
  action :nothing
end
