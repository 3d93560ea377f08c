# containerd with systemd cgroups (kubelet's default driver) and, on GPU nodes, the NVIDIA runtime.

package node['dlinfra_base']['containerd']['package']

directory '/etc/containerd'

template '/etc/containerd/config.toml' do
  source 'containerd-config.toml.erb'
  variables(
    sandbox_image: node['dlinfra_base']['containerd']['sandbox_image'],
    default_runtime: dlinfra_containerd_runtime,
    nvidia_runtime_binary: node['dlinfra_base']['containerd']['nvidia_runtime_binary']
  )
  only_if { node['dlinfra_base']['containerd']['manage_config'] }
  notifies :restart, 'service[containerd]', :delayed
end

service 'containerd' do
  action %i(enable start)
end
