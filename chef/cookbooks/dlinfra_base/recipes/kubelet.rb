# kubelet and kubectl for EC2 node images, pinned to the cluster's minor version. Site nodes get theirs
# from `nodeadm install` (dlinfra_hybrid) instead.

apt_repository 'kubernetes' do
  uri dlinfra_kubernetes_apt_uri
  key "#{dlinfra_kubernetes_apt_uri}Release.key"
  distribution '/'
  components []
end

# A kubelet newer than the control plane by a minor version is unsupported: pin the minor.
apt_preference 'kubernetes' do
  glob node['dlinfra_base']['kubernetes']['packages'].join(' ')
  pin "version #{node['dlinfra_base']['kubernetes']['version']}.*"
  pin_priority '1001'
end

package node['dlinfra_base']['kubernetes']['packages']

# Enabled, not started: dlinfra-node-join (run by the node pool's user data) configures and starts it.
service 'kubelet' do
  action :enable
end

include_recipe 'dlinfra_base::node_join'
